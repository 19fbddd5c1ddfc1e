"""What the benchmarks share: a throwaway migrated database and Redis namespace, quantiles and
a figures table. Benchmarks never touch LIYAGENT_DATABASE_URL's database: they use this
machine's servers on their default ports (or private ones) and remove what they made."""

from __future__ import annotations

import math
import os
import sys
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

from rich.console import Console
from rich.table import Table

from liyagent.local.backends import MACHINE_PG_ADMIN, Backends, close_backends, open_backends
from runtime import logs
from store import admin

SERVER_VARS = ("LIYAGENT_DATABASE_URL", "LIYAGENT_REDIS_URL")


def use_machine_servers() -> None:
    """Forget configured servers for this process, so a bench never fills a real database;
    engine logs go to stderr, warnings only, so stdout holds just the figures."""
    logs.configure(level="WARNING")
    ignored = [name for name in SERVER_VARS if os.environ.pop(name, None)]
    if ignored:
        print(f"(ignoring {', '.join(ignored)}: benchmarks use throwaway servers)", file=sys.stderr)


@contextmanager
def throwaway(tag: str) -> Iterator[Backends]:
    """A fresh migrated database and Redis namespace, dropped and deleted at the end."""
    use_machine_servers()
    suffix = uuid.uuid4().hex[:10]
    backends = Backends(namespace=f"bench:{suffix}:")
    try:
        yield open_backends(backends, f"liyagent_bench_{tag}_{suffix}")
    finally:
        if backends.created_database is not None:
            admin.drop_database(MACHINE_PG_ADMIN, backends.created_database)
        close_backends(backends)


def quantile(samples: Sequence[float], q: float) -> float:
    """The nearest-rank quantile (as the trials' verdict computes it)."""
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


def print_table(title: str, columns: Sequence[str], rows: Sequence[Sequence[object]]) -> None:
    """The figures as a small table on stdout, under its title."""
    console = Console(highlight=False, width=max(120, Console().width))
    console.print(title)
    table = Table()
    for i, name in enumerate(columns):
        table.add_column(name, justify="left" if i == 0 else "right")
    for row in rows:
        table.add_row(*(str(cell) for cell in row))
    console.print(table)
