"""`liyagent retention run`: a retention pass now, under the settings in force, instead of
waiting for beat's next one (after lowering a keep, say); `--dry-run` says what it would
delete, table by table, and deletes nothing."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import asdict
from typing import Any

from rich.table import Table
from rich.text import Text

from liyagent.cli.common import FAILED, OK, CliError, add_json, out, print_json, read_client
from store.retention import Expired, Keeps

DAY = 86400


def cmd_retention_run(args: argparse.Namespace) -> int:
    """Delete every finished run and audit row past its keep now (batches until none is
    left), or with --dry-run count them by table; exit 1 when retention is off
    (LIYAGENT_RETENTION=false) and this is not a dry run."""
    from runtime.ops.retention import expired_now, keeps_of, run_retention

    # Publishes nothing and never makes a seal key: retention opens no sealed row.
    s = read_client().s
    keeps = keeps_of(s.settings)
    enabled = s.settings.retention.enabled
    if args.dry_run:
        expired = expired_now(s.engine, s.settings)
        if args.json:
            print_json(_dry_run_json(enabled, keeps, expired))
        else:
            _render_dry_run(enabled, keeps, expired)
        return OK
    if not enabled:
        raise CliError(
            "retention is off (LIYAGENT_RETENTION=false): nothing was deleted; give this "
            "command LIYAGENT_RETENTION=true to run a pass (--dry-run says what it would delete)",
            FAILED,
        )
    report = run_retention(s.engine, s.redis, s.settings, until_done=True)
    if args.json:
        print_json(
            {"dry_run": False, "enabled": True, "keeps": asdict(keeps),
             "deleted": {"runs": report.runs, "audit_events": report.audit},
             "batches": report.batches}
        )  # fmt: skip
    else:
        out().print(
            Text(
                f"Deleted {report.runs} finished runs (with every row that names them) and "
                f"{report.audit} audit rows, in {report.batches} batches, under {_keeps(keeps)}."
            )
        )
    return OK


def _dry_run_json(enabled: bool, keeps: Keeps, expired: Expired) -> dict[str, Any]:
    return {
        "dry_run": True,
        "enabled": enabled,
        "keeps": asdict(keeps),
        "would_delete": expired.rows,
        "oldest_finished": expired.oldest.isoformat() if expired.oldest else None,
        "newest_finished": expired.newest.isoformat() if expired.newest else None,
    }


def _render_dry_run(enabled: bool, keeps: Keeps, expired: Expired) -> None:
    console = out()
    console.print(
        Text(f"Dry run: nothing was deleted. Under {_keeps(keeps)}, a pass would delete:")
    )
    table = Table("table", "rows", show_edge=False)
    for name, n in expired.rows.items():
        table.add_row(name, str(n))
    console.print(table)
    if expired.oldest is not None and expired.newest is not None:
        console.print(
            Text(
                f"Runs that finished from {expired.oldest:%Y-%m-%d %H:%M:%S} to "
                f"{expired.newest:%Y-%m-%d %H:%M:%S} UTC."
            )
        )
    if not enabled:
        console.print(Text("Retention is off (LIYAGENT_RETENTION=false): beat deletes none."))


def _keeps(keeps: Keeps) -> str:
    """The keeps in words, as the settings give them."""
    return (
        f"the settings in force (runs {_span(keeps.keep_s)} after they finish, "
        f"{_span(keeps.key_window_s)} at least for a run a caller may repeat by key, answers "
        f"{_span(keeps.answer_keep_s)}, audit rows {_span(keeps.audit_keep_s)})"
    )


def _span(seconds: int) -> str:
    if seconds % DAY == 0:
        return f"{seconds // DAY} d"
    return f"{seconds} s"


def _retention(retention: argparse.ArgumentParser) -> None:
    """The `retention run` sub-command."""
    actions = retention.add_subparsers(dest="action", required=True)
    p = actions.add_parser(
        "run",
        help="run a retention pass now, under the settings in force",
        description=(
            "Delete every finished run (with its marks, steps, transcript, approvals and entry "
            "rows) and audit row past its keep now, in batches until none is left, as beat "
            "does every LIYAGENT_RETENTION_INTERVAL_S. Every keep is the setting in force, "
            "counted from a run's finish, so a lowered one applies to runs finished before."
        ),
    )
    p.add_argument(
        "--dry-run", action="store_true", help="say what would go, by table, and delete nothing"
    )
    add_json(p)
    p.set_defaults(handler=cmd_retention_run)


ARGUMENTS: dict[str, Callable[[argparse.ArgumentParser], None]] = {"retention": _retention}
