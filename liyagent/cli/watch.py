"""`liyagent watch RUN`: a run's events as they are recorded (from Postgres, woken by the
engine's nudge), in a rich Live table that ends when the run ends; `--json` prints one JSON
line per event instead. An unknown or malformed run id is an error (exit 1 or 2), no
traceback."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable

from rich.console import Console
from rich.live import Live
from rich.table import Table

from liyagent.cli.common import FAILED, OK, add_json
from runtime.ops.events import RunEvent

_SHOWN = (
    "worker",
    "tool",
    "settlement",
    "seen",
    # A wait for a model endpoint, a 429 met (runtime/flow/waiting.py's words).
    "endpoint",
    "reason",
    "limit",
    "wait_ms",
    "until",
    "retry_after_s",
    "waiting_on",
    "code",
    "status",
    # A definition drift (runtime/core/drift.py).
    "pin",
    "policy",
    "repinned",
    "served",
)


def _details(e: RunEvent) -> str:
    parts = [f"{k}={e.details[k]}" for k in _SHOWN if e.details.get(k) not in (None, "")]
    changes = e.details.get("changes")
    if changes:
        parts.append("changes=" + "; ".join(f"{c['name']} {c['change']}" for c in changes))
    calls = e.details.get("calls")
    if calls:
        parts.append("calls=" + ",".join(f"{c.get('tool')}:{c.get('settled')}" for c in calls))
    return " ".join(parts)


def _table(run_id: str) -> Table:
    table = Table(title=f"run {run_id}", expand=False)
    for name in ("seq", "at", "event", "attempt", "step", "details"):
        table.add_column(name)
    return table


def cmd_watch(args: argparse.Namespace) -> int:
    """Follow one run's events until it ends; exit 0 when it succeeded, 1 when it failed."""
    from tasks.services import client

    c = client()
    run_id = c.resolve_run_id(args.run_id)
    events = c.follow(run_id, after=args.after)
    if args.json:
        for e in events:
            print(json.dumps(e.to_json()), flush=True)
    else:
        table = _table(run_id)
        with Live(table, console=Console(), refresh_per_second=8):
            for e in events:
                step = "" if e.step is None else str(e.step)
                at = e.at.strftime("%H:%M:%S.%f")[:-3]
                table.add_row(str(e.seq), at, e.kind.value, str(e.attempt), step, _details(e))
    status = c.get(run_id).status
    if not args.json:
        print(f"run {run_id} {status}")
    return OK if status == "succeeded" else FAILED


def _watch(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_id", metavar="RUN_ID")
    p.add_argument("--after", type=int, default=0, help="start after this event seq")
    add_json(p)
    p.set_defaults(handler=cmd_watch)


ARGUMENTS: dict[str, Callable[[argparse.ArgumentParser], None]] = {"watch": _watch}
