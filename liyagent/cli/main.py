"""`liyagent`: make seal keys, migrate, start and watch runs, workflows and jobs, decide
approvals, stop runs, call a tool ad hoc, inspect a run, serve the front and metrics, the demo.

Exit codes scripts can rely on: 0 ok, 1 operational failure (a run failed, a timeout, no such
run), 2 bad usage or input (nothing was stored), 3 Postgres or Redis cannot be reached.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import kombu.exceptions
import redis
import sqlalchemy as sa

from liyagent.cli import ops as cli_ops
from liyagent.cli import retention as cli_retention
from liyagent.cli import runs as cli_runs
from liyagent.cli import serve as cli_serve
from liyagent.cli import trials as cli_trials
from liyagent.cli import watch as cli_watch
from liyagent.cli.common import (
    FAILED,
    OK,
    UNREACHABLE,
    USAGE,
    CliError,
    add_json,
    name_list,
    out,
    print_json,
    safe_url,
)
from runtime.base import logs
from runtime.base.redis_clients import RedisTarget
from runtime.base.sealing import new_key_entry
from runtime.base.settings import ConfigError, database_url, get_settings
from runtime.durable.workflow_spec import WorkflowError
from runtime.entries.client import BadRequest, resolve_run_id
from runtime.models.scripted import ScriptError
from runtime.ops.adhoc import UnknownTool
from runtime.toolbox.tools import ToolDeclarationError, ToolError
from store.rows import RunNotFound

__all__ = ["FAILED", "OK", "UNREACHABLE", "USAGE", "CliError", "build_parser", "main"]

DESCRIPTION = (
    "Durable LLM agent runs: seal keys, migrations, runs, workflows, jobs, approvals, stops, "
    "ad hoc calls, status, inspect, the app front, metrics, the demo and the kill trials."
)
_KID = re.compile(r"[A-Za-z0-9_.-]{1,64}")


def cmd_keys_new(args: argparse.Namespace) -> int:
    """Print one fresh `kid:base64key` entry for LIYAGENT_SEAL_KEYS."""
    kid = args.kid or f"k{datetime.now(UTC):%Y%m%d}"
    if not _KID.fullmatch(kid):
        raise CliError(f"key id {kid!r}: use 1-64 letters, digits, '.', '_' or '-'", USAGE)
    print(new_key_entry(kid))
    return OK


def cmd_keys_token(args: argparse.Namespace) -> int:
    """Print a fresh bearer token for the front (line 1, give it to its holder) and its entry
    for LIYAGENT_FRONT_TOKENS_FILE (line 2: the principal, the token's SHA-256, the rights)."""
    import json
    import secrets

    from front.auth import Right, token_digest

    name = args.principal.strip()
    if not name or len(name) > 200 or any(ord(c) < 32 or ord(c) == 127 for c in name):
        raise CliError("the principal must be one line of 1-200 characters", USAGE)
    rights = name_list(args.rights, "--rights", [r.value for r in Right])
    token = secrets.token_urlsafe(32)
    print(token)
    print(json.dumps({"principal": name, "sha256": token_digest(token), "rights": rights}))
    return OK


def cmd_db_upgrade(args: argparse.Namespace) -> int:
    """Migrate the database to the latest schema (Alembic head)."""
    from runtime.base.sealing import open_sealer
    from runtime.durable.definition import legacy_sealer
    from store import migrate

    settings = get_settings()
    url = database_url(args.url, "--url") if args.url else settings.database_url
    sealer = open_sealer(settings.production)
    try:
        # Runs in flight during the upgrade have their definitions sealed with the keys.
        migrate.upgrade(url, seal_definition=legacy_sealer(sealer) if sealer.keys else None)
    except sa.exc.OperationalError as exc:
        raise _postgres_error(exc, url) from None
    except RuntimeError as exc:  # a migration that cannot go on says what to do
        raise CliError(str(exc), USAGE) from None
    print(f"{safe_url(url)}: the schema is at the latest revision", file=sys.stderr)
    return OK


def cmd_status(args: argparse.Namespace) -> int:
    """One run's status, or a table of the most recent runs."""
    from liyagent.cli.common import read_client
    from liyagent.reporting import render_recent, render_view, summary_json, view_json
    from store.views import recent_runs

    c = read_client()
    if args.run_id:
        view = c.get(c.resolve_run_id(args.run_id))
        if args.json:
            print_json(view_json(view))
        else:
            render_view(out(), view)
        return OK
    if args.limit < 1:
        raise CliError("--limit must be at least 1", USAGE)
    with c.s.engine.connect() as conn:
        runs = recent_runs(conn, args.limit)
    if args.json:
        print_json([summary_json(r) for r in runs])
    else:
        render_recent(out(), runs)
    return OK


def cmd_inspect(args: argparse.Namespace) -> int:
    """A run's attempts, checkpoints, call marks, audit, transcript and model requests."""
    from liyagent.reporting import inspect_run, render_report, report_json
    from runtime.base.sealing import NoSealKeys, open_sealer
    from store import db

    files = {"html": _output_file(args.html, "--html"), "png": _output_file(args.png, "--png")}
    settings = get_settings()
    engine = db.engine_for(settings.database_url)
    run_id = resolve_run_id(engine, args.run_id)
    sealer = open_sealer(settings.production)  # a read: never makes a key
    if not sealer.keys:
        raise NoSealKeys(f"cannot verify run {run_id}'s checkpoints: {sealer.missing}")
    report = inspect_run(engine, sealer, run_id)
    if files["html"] or files["png"]:
        _write_timeline(engine, run_id, files)
    written = {k: str(v) for k, v in files.items() if v is not None}
    if args.json:
        print_json({**report_json(report), **({"timeline_files": written} if written else {})})
    else:
        render_report(out(), report)
        for kind, path in written.items():
            out().print(f"Timeline ({kind.upper()}): {path}", soft_wrap=True)
    return OK


def _output_file(value: str | None, flag: str) -> Path | None:
    """A file to write: its folder must exist and it must not be a folder (checked before
    anything is read)."""
    if value is None:
        return None
    path = Path(value)
    if path.is_dir():
        raise CliError(f"{flag} {value} is a folder; name the file to write", USAGE)
    if not path.parent.is_dir():
        raise CliError(f"{flag} {value}: the folder {path.parent} does not exist", USAGE)
    return path


def _write_timeline(engine: sa.Engine, run_id: str, files: dict[str, Path | None]) -> None:
    """The run's timeline as HTML and/or PNG; a file that cannot be written is bad input."""
    from liyagent.reporting import write_timeline

    try:
        write_timeline(engine, run_id, files["html"], files["png"])
    except OSError as exc:
        raise CliError(
            f"cannot write the timeline of run {run_id} to {exc.filename}: {exc.strerror}", USAGE
        ) from None


def cmd_demo(args: argparse.Namespace) -> int:
    """The crash-resume demo (see runtime/demo.py)."""
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


def build_parser() -> argparse.ArgumentParser:
    """The argument parser: one sub-command per task."""
    parser = argparse.ArgumentParser(prog="liyagent", description=DESCRIPTION)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    keys = sub.add_parser("keys", help="seal keys").add_subparsers(dest="action", required=True)
    p = keys.add_parser("new", help="print a fresh kid:base64key entry")
    p.add_argument("kid", nargs="?", help="key id (default: k<today>, e.g. k20261130)")
    p.set_defaults(handler=cmd_keys_new)
    p = keys.add_parser(
        "token",
        help="print a new front bearer token and its LIYAGENT_FRONT_TOKENS_FILE entry",
        description=(
            "Line 1: a new bearer token (give it to its holder; it is not stored). Line 2: its "
            'entry for the "tokens" list of LIYAGENT_FRONT_TOKENS_FILE or LIYAGENT_FRONT_TOKENS: '
            "the principal, the token's SHA-256 and the rights."
        ),
    )
    p.add_argument("principal", help="who the token speaks for (recorded as who decides/stops)")
    p.add_argument(
        "--rights",
        default="start,decide,stop,read",
        help="comma list of start, decide, stop, erase, read, operate (default: all but erase, "
        "which deletes runs' content, and operate, which reads every caller's runs and tasks, "
        "only when named)",
    )
    p.set_defaults(handler=cmd_keys_token)
    dbp = sub.add_parser("db", help="database schema").add_subparsers(dest="action", required=True)
    p = dbp.add_parser("upgrade", help="migrate to the latest schema")
    p.add_argument("--url", help="database URL (default: LIYAGENT_DATABASE_URL)")
    p.set_defaults(handler=cmd_db_upgrade)
    cli_runs.add_parsers(sub)
    cli_watch.add_parsers(sub)
    p = sub.add_parser("status", help="one run, or the most recent runs")
    p.add_argument("run_id", nargs="?", metavar="RUN_ID")
    p.add_argument("--limit", type=int, default=20, help="how many recent runs (default 20)")
    add_json(p)
    p.set_defaults(handler=cmd_status)
    p = sub.add_parser("inspect", help="everything recorded about one run")
    p.add_argument("run_id", metavar="RUN_ID")
    p.add_argument("--html", metavar="FILE", help="also write the run's timeline as HTML")
    p.add_argument("--png", metavar="FILE", help="also write the run's timeline as a PNG")
    add_json(p)
    p.set_defaults(handler=cmd_inspect)
    cli_ops.add_parsers(sub)
    cli_retention.add_parsers(sub)
    cli_serve.add_parsers(sub)
    _add_demo_parser(sub)
    cli_trials.add_parsers(sub)
    return parser


def _add_demo_parser(sub: Any) -> None:
    """The `demo` sub-command and its options."""
    p = sub.add_parser(
        "demo",
        help="the crash-resume demo: a worker SIGKILLed mid-run",
        description=(
            "Start a simulator, two workers, beat, the app front and Flower, enqueue a batch "
            "(client API runs, Teams turns and a webhook call), SIGKILL one worker mid-run "
            "and report how every run resumed. Uses LIYAGENT_DATABASE_URL and LIYAGENT_REDIS_URL "
            "when set, else the machine's servers on their default ports (creating the database "
            "LIYAGENT_DEMO_DATABASE, default liyagent_demo), else private ones. Exit 0 when no run "
            "is lost or failed and no write is repeated, 1 otherwise, 3 without Postgres or Redis."
        ),
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


def _postgres_error(exc: sa.exc.OperationalError, url: str) -> CliError:
    """Postgres refused or could not be reached: say which server and what to do (exit 3), in
    the words a worker refusing to start uses (runtime/recovery/outage.py)."""
    from runtime.recovery.outage import database_problem

    return CliError(database_problem(exc, url), UNREACHABLE)


def _classify(exc: BaseException) -> CliError | None:
    """Map an exception to the message and exit code the user sees, or None if unexpected."""
    if isinstance(exc, CliError):
        return exc
    if isinstance(
        exc,
        BadRequest | ConfigError | ScriptError | WorkflowError | UnknownTool | sa.exc.ArgumentError,
    ):
        return CliError(str(exc), USAGE)
    if isinstance(exc, ToolDeclarationError):  # a tool module or MCP server that does not load
        return CliError(f"{exc}; nothing was stored", USAGE)
    if isinstance(exc, ToolError):  # only raised before a call is sent (a kind made by runs)
        return CliError(f"{exc}; nothing was sent", USAGE)
    if isinstance(exc, RunNotFound):
        return CliError(str(exc), FAILED)
    if isinstance(exc, sa.exc.OperationalError):
        return _postgres_error(exc, get_settings().database_url)
    if isinstance(exc, sa.exc.ProgrammingError):
        from runtime.recovery.outage import (
            schema_problem,  # a worker refusing to start says the same
        )

        return CliError(schema_problem(exc), FAILED)
    if isinstance(exc, redis.exceptions.ConnectionError | redis.exceptions.TimeoutError):
        return CliError(
            f"cannot reach Redis at {RedisTarget.of(get_settings()).describe()} ({exc}); "
            "start it or set LIYAGENT_REDIS_URL",
            UNREACHABLE,
        )
    if isinstance(exc, kombu.exceptions.OperationalError):
        return CliError(f"cannot publish to the broker ({exc}); check Redis", UNREACHABLE)
    return None


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; returns the exit code (argparse itself exits 2 on bad usage)."""
    args = build_parser().parse_args(argv)
    logs.configure(level=_quiet_level())
    handler: Callable[[argparse.Namespace], int] = args.handler
    try:
        return handler(args)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except Exception as exc:
        error = _classify(exc)
        if error is None:
            raise
        print(f"liyagent: error: {error}", file=sys.stderr)
        return error.code


def _quiet_level() -> str:
    """Engine logs on a terminal are noise for a CLI: warnings only unless asked for more."""
    return os.environ.get("LIYAGENT_LOG_LEVEL") or "WARNING"


if __name__ == "__main__":
    sys.exit(main())
