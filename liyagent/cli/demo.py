"""`liyagent demo`: the crash-resume demo (liyagent/demo.py), a worker SIGKILLed mid-run."""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from pathlib import Path

from liyagent.cli.common import USAGE, CliError, add_json


def cmd_demo(args: argparse.Namespace) -> int:
    """The crash-resume demo (see liyagent/demo.py)."""
    from liyagent.demo import DEFAULT_DATABASE, DemoOptions, run_demo

    if not 2 <= args.runs <= 200:
        raise CliError("--runs must be between 2 and 200", USAGE)
    options = DemoOptions(
        runs=args.runs,
        json=args.json,
        timeout_s=args.timeout,
        report_dir=Path(args.report_dir),
        private=args.private_servers,
        database=os.environ.get("LIYAGENT_DEMO_DATABASE") or DEFAULT_DATABASE,
    )
    return run_demo(options)


def _demo(p: argparse.ArgumentParser) -> None:
    """The `demo` sub-command's options."""
    p.description = (
        "Start a simulator, two workers, beat, the app front and Flower, enqueue a batch "
        "(client API runs, Teams turns and a webhook call), SIGKILL one worker mid-run "
        "and report how every run resumed. Uses LIYAGENT_DATABASE_URL and LIYAGENT_REDIS_URL "
        "when set, else the machine's servers on their default ports (creating the database "
        "LIYAGENT_DEMO_DATABASE, default liyagent_demo), else private ones. Exit 0 when no run "
        "is lost or failed and no write is repeated, 1 otherwise, 3 without Postgres or Redis."
    )
    p.add_argument("--runs", type=int, default=8, help="runs in the batch (default 8)")
    p.add_argument("--timeout", type=float, default=120.0, help="seconds to wait after the kill")
    p.add_argument("--report-dir", default="reports", help="where the HTML report goes")
    p.add_argument(
        "--private-servers",
        action="store_true",
        help="always start private Postgres and Redis, even if the machine's answer",
    )
    add_json(p)
    p.set_defaults(handler=cmd_demo)


ARGUMENTS: dict[str, Callable[[argparse.ArgumentParser], None]] = {"demo": _demo}
