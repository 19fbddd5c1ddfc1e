"""`liyagent status` and `liyagent inspect`: what Postgres records about runs, read with the
database and the seal keys alone (no Redis, no tool modules, no Celery), so an operator's most
typed commands start fast and work while Redis is away."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from liyagent.cli.common import OK, USAGE, CliError, add_json, out, print_json

if TYPE_CHECKING:
    import sqlalchemy as sa


def cmd_status(args: argparse.Namespace) -> int:
    """One run's status, or a table of the most recent runs."""
    from liyagent.reporting import render_recent, render_view, summary_json, view_json
    from runtime.base.sealing import open_sealer
    from runtime.base.settings import get_settings
    from runtime.ops.run_view import read_view, resolve_run_id
    from store import db
    from store.views import recent_runs

    if not args.run_id and args.limit < 1:
        raise CliError("--limit must be at least 1", USAGE)
    settings = get_settings()
    # A read: opens the seal keys there are, never makes one (production without any refuses,
    # as every process does, even for the list).
    sealer = open_sealer(settings.production)
    engine = db.engine_for(settings.database_url, pooler=settings.database_pooler)
    if args.run_id:
        run_id = resolve_run_id(engine, args.run_id)
        view = read_view(engine, sealer, run_id)
        if args.json:
            print_json(view_json(view))
        else:
            render_view(out(), view)
        return OK
    with engine.connect() as conn:
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
    from runtime.base.settings import get_settings
    from runtime.ops.run_view import resolve_run_id
    from store import db

    files = {"html": _output_file(args.html, "--html"), "png": _output_file(args.png, "--png")}
    settings = get_settings()
    engine = db.engine_for(settings.database_url, pooler=settings.database_pooler)
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


def _status(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_id", nargs="?", metavar="RUN_ID")
    p.add_argument("--limit", type=int, default=20, help="how many recent runs (default 20)")
    add_json(p)
    p.set_defaults(handler=cmd_status)


def _inspect(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_id", metavar="RUN_ID")
    p.add_argument("--html", metavar="FILE", help="also write the run's timeline as HTML")
    p.add_argument("--png", metavar="FILE", help="also write the run's timeline as a PNG")
    add_json(p)
    p.set_defaults(handler=cmd_inspect)


ARGUMENTS: dict[str, Callable[[argparse.ArgumentParser], None]] = {
    "status": _status,
    "inspect": _inspect,
}
