"""What every `liyagent` sub-command shares: exit codes, the error it exits with, output
helpers and JSON input, so the command modules stay small and agree with each other.

The parser imports this module for every command, `--help` included: it imports nothing heavy
at its top (rich, SQLAlchemy and the engine only inside the helpers that use them)."""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Sequence

    from rich.console import Console

    from runtime.entries.client import Client
    from store.rows import QueuedAttempt

OK, FAILED, USAGE, UNREACHABLE = 0, 1, 2, 3


class CliError(Exception):
    """A failure to report on stderr with the exit code scripts should see."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code


# Output piped to a script or grep has no width to fit: nothing is wrapped or cut (rich would
# otherwise assume 80 columns and fold ids, names and times across lines). COLUMNS, when set,
# still counts.
PIPED_WIDTH = 100_000


def out() -> Console:
    """A console for people: no colour guessing on data, no markup highlighting; when stdout
    is not a terminal, as wide as any line is."""
    from rich.console import Console

    console = Console(highlight=False)
    if not console.is_terminal and "COLUMNS" not in os.environ:
        return Console(highlight=False, width=PIPED_WIDTH)
    return console


def print_json(payload: Any) -> None:
    """One JSON document on stdout, keys sorted, for scripts."""
    print(json.dumps(payload, sort_keys=True, default=str), flush=True)


def safe_url(url: str) -> str:
    """The URL with any password hidden, fit for messages."""
    import sqlalchemy as sa

    return str(sa.make_url(url).render_as_string(hide_password=True))


def postgres_error(exc: BaseException, url: str) -> CliError:
    """Postgres refused or could not be reached: say which server and what to do (exit 3), in
    the words a worker refusing to start uses (runtime/recovery/outage.py)."""
    from runtime.recovery.outage import database_problem

    return CliError(database_problem(exc, url), UNREACHABLE)


def add_json(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="print one JSON document on stdout")


def add_wait(p: argparse.ArgumentParser) -> None:
    """--wait and --timeout, shared by the commands that start a run."""
    p.add_argument("--wait", action="store_true", help="wait for the run to end")
    p.add_argument("--timeout", type=float, default=120.0, help="seconds to wait (default 120)")


def json_object(raw: str, flag: str, nothing: str = "nothing was stored") -> dict[str, Any]:
    """A JSON option that must be an object; anything else is bad input (exit 2)."""
    try:
        value = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise CliError(f"{flag} is not JSON ({exc}); {nothing}", USAGE) from None
    if not isinstance(value, dict):
        raise CliError(f"{flag} must be a JSON object; {nothing}", USAGE)
    return value


def json_file(path: str, what: str) -> Any:
    """Read and parse a JSON file; unreadable or malformed is bad input (exit 2)."""
    try:
        raw = Path(path).read_text()
    except OSError as exc:
        raise CliError(f"cannot read the {what} file {path}: {exc.strerror}", USAGE) from None
    try:
        return json.loads(raw)
    except json.JSONDecodeError as exc:
        raise CliError(f"{path} is not JSON: {exc}", USAGE) from None


def name_list(raw: str, flag: str, known: list[str], nothing: str = "") -> list[str]:
    """A comma list option whose every name must be one of `known` (bad input otherwise)."""
    names = [n.strip() for n in raw.split(",") if n.strip()]
    unknown = sorted(set(names) - set(known))
    if unknown or not names:
        raise CliError(
            f"{flag} {raw!r}: unknown {', '.join(unknown) or 'empty list'}; "
            f"choose from {', '.join(known)}{nothing}",
            USAGE,
        )
    return names


def who(raw: str, flag: str = "--by") -> str:
    """A non-blank name of who acts; a blank one is bad input."""
    name = raw.strip()
    if not name:
        raise CliError(f"{flag} must name who acts; nothing was stored", USAGE)
    return name


class _NoPublisher:
    """Read commands publish nothing; a publish from one is a bug, said loudly."""

    def publish(self, run_id: str, attempt: int, priority: int = 2) -> None:
        raise RuntimeError(f"a read-only command tried to publish run {run_id}")

    def publish_many(self, runs: Sequence[QueuedAttempt]) -> None:
        raise RuntimeError(f"a read-only command tried to publish {len(runs)} runs")


def read_client() -> Client:
    """A client for commands that only read (`status`): it opens the seal keys that exist and
    never makes one (see runtime/base/sealing.py `open_sealer`)."""
    from runtime import services
    from runtime.base.sealing import open_sealer
    from runtime.base.settings import get_settings
    from runtime.entries.client import Client

    settings = get_settings()
    return Client(services.build(settings, _NoPublisher(), sealer=open_sealer(settings.production)))
