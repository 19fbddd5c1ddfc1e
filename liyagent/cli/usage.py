"""`liyagent usage`: what runs used and cost, by agent, owner, tenant or day, over the last
days (exact usage of written steps and unconfirmed usage of lost attempts apart), read from
Postgres alone; `--principal` keeps to the runs one front principal started (as the front
scopes its reads), `--agent` and `--tenant` to one of each."""

from __future__ import annotations

import argparse
from collections.abc import Callable

from liyagent.cli.common import OK, USAGE, CliError, add_json, out, print_json

BY = ("agent", "tenant", "day", "owner")
MAX_DAYS = 3660


def cmd_usage(args: argparse.Namespace) -> int:
    """The report, as a table or JSON."""
    from datetime import UTC, datetime, timedelta

    from liyagent.ledger_view import render_report
    from runtime.base.settings import get_settings
    from store import db
    from store.ledger import usage_by

    if not 1 <= args.days <= MAX_DAYS:
        raise CliError(f"--days: from 1 to {MAX_DAYS}, not {args.days}", USAGE)
    since = datetime.now(UTC) - timedelta(days=args.days)
    settings = get_settings()
    engine = db.engine_for(settings.database_url, pooler=settings.database_pooler)
    with engine.connect() as conn:
        lines = usage_by(
            conn, args.by, since, principal=args.principal, agent=args.agent, tenant=args.tenant
        )
    if args.json:
        print_json(
            {"by": args.by, "since": since.isoformat(), "lines": [x.to_json() for x in lines]}
        )
    else:
        render_report(out(), args.by, lines, f"{since:%Y-%m-%d %H:%M} UTC")
    return OK


def _usage(p: argparse.ArgumentParser) -> None:
    p.description = (
        "Tokens and cost of runs' model steps over the last --days, grouped --by agent, tenant, "
        "day (UTC) or owner: exact usage (each written step's, counted once, as its provider "
        "reported it) and unconfirmed usage (what a lost attempt reserved for a step it never "
        "wrote: an upper bound of what that request was billed), apart. Cost is at the prices "
        "in force when each row was written (LIYAGENT_MODEL_PRICES); rows of unpriced models "
        "count their tokens, not their cost."
    )
    p.add_argument("--by", choices=BY, default="agent", help="how to group (default agent)")
    p.add_argument("--days", type=int, default=30, help="how many days back (default 30)")
    p.add_argument("--agent", help="only this agent's runs")
    p.add_argument("--tenant", help="only this tenant's runs")
    p.add_argument("--principal", help="only the runs this front principal started")
    add_json(p)
    p.set_defaults(handler=cmd_usage)


ARGUMENTS: dict[str, Callable[[argparse.ArgumentParser], None]] = {"usage": _usage}
