"""`liyagent budget`: what runs may spend (issue 34, item 4). `raise RUN` sets one run's budget
(and wakes it when it waits on it); `set --agent A | --tenant T --period day|month` sets what an
agent's or a tenant's runs may spend a period (UTC) and wakes those waiting on it; `list` shows
every agent's and tenant's budget with its period's spend."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import TYPE_CHECKING

from rich.table import Table
from rich.text import Text

from liyagent.cli.common import OK, add_json, out, print_json, read_client

if TYPE_CHECKING:
    from runtime.entries.client import Client


def _client() -> Client:
    from tasks.services import client

    return client()


def cmd_budget_raise(args: argparse.Namespace) -> int:
    """Set a run's budget (what it may spend in all); a run waiting on it continues at once."""
    c = _client()
    run_id = c.resolve_run_id(args.run)
    woke = c.raise_budget(run_id, tokens=args.tokens, usd=args.usd)
    if args.json:
        print_json({"run_id": run_id, "woken": woke})
    else:
        said = (
            "it was waiting on its budget and continues now" if woke else "it was not waiting on it"
        )
        out().print(Text(f"Budget of run {run_id} set; {said}."))
    return OK


def cmd_budget_set(args: argparse.Namespace) -> int:
    """Set an agent's or a tenant's budget a period; its runs waiting on it continue at once."""
    woken = _client().set_budget(
        agent=args.agent,
        tenant=args.tenant,
        period=args.period,
        tokens=args.tokens,
        usd=args.usd,
        lift=args.lift or (),
    )
    who = f"agent {args.agent}" if args.agent is not None else f"tenant {args.tenant}"
    if args.json:
        print_json({"scope": who, "period": args.period, "woken": woken})
    else:
        out().print(Text(f"Budget of {who} per {args.period} set; {len(woken)} runs woken."))
    return OK


def cmd_budget_list(args: argparse.Namespace) -> int:
    """Every agent's and tenant's budget, its period's spend and when the period ends."""
    from runtime.ops.budgets import list_budgets

    rows = list_budgets(read_client().s.engine)
    if args.json:
        print_json(
            [
                {
                    "scope": r.scope,
                    "name": r.name,
                    "period": r.period,
                    "tokens": r.tokens,
                    "usd": None if r.usd is None else str(r.usd),
                    "spent_tokens": r.spent_tokens,
                    "spent_usd": str(r.spent_usd),
                    "period_ends": r.ends.isoformat(),
                }
                for r in rows
            ]
        )
        return OK
    table = Table("scope", "name", "period", "tokens", "usd", "spent", "ends", show_edge=False)
    for r in rows:
        table.add_row(
            r.scope,
            r.name,
            r.period,
            "-" if r.tokens is None else str(r.tokens),
            "-" if r.usd is None else str(r.usd),
            f"{r.spent_tokens} tokens, ${r.spent_usd}",
            f"{r.ends:%Y-%m-%d %H:%M} UTC",
        )
    out().print(table)
    return OK


def _amounts(p: argparse.ArgumentParser) -> None:
    p.add_argument("--tokens", help="tokens (input and output), a whole number, 0 or more")
    p.add_argument("--usd", help="US dollars, 0 or more (priced by LIYAGENT_MODEL_PRICES)")
    add_json(p)


def _budget(budget: argparse.ArgumentParser) -> None:
    """The `budget raise|set|list` sub-commands."""
    actions = budget.add_subparsers(dest="action", required=True)
    p = actions.add_parser(
        "raise",
        help="set one run's budget; a run waiting on it continues",
        description=(
            "Set what a run may spend in all (what it spent so far included); either or both "
            "of --tokens and --usd, the other kept. A run waiting on its budget is woken in the "
            "same statement and continues at once."
        ),
    )
    p.add_argument("run", help="the run (its id, or a unique prefix)")
    _amounts(p)
    p.set_defaults(handler=cmd_budget_raise)
    p = actions.add_parser(
        "set",
        help="set an agent's or a tenant's budget per day or month",
        description=(
            "Set what one agent's (or one tenant's) runs may spend a period (day or month, "
            "UTC), shared by all of them; the period's spend so far is kept, and so is the "
            "amount not given (--lift removes it). Runs waiting on it are woken and reserve "
            "again; the sweeper wakes them when the period turns."
        ),
    )
    who = p.add_mutually_exclusive_group(required=True)
    who.add_argument("--agent", help="the agent's name")
    who.add_argument("--tenant", help="the tenant's name (a run's tenant, else its owner)")
    p.add_argument("--period", required=True, choices=("day", "month"))
    p.add_argument(
        "--lift",
        action="append",
        choices=("tokens", "usd"),
        help="remove that limit (repeatable); an amount neither given nor lifted is kept",
    )
    _amounts(p)
    p.set_defaults(handler=cmd_budget_set)
    p = actions.add_parser("list", help="every agent's and tenant's budget and its spend")
    add_json(p)
    p.set_defaults(handler=cmd_budget_list)


ARGUMENTS: dict[str, Callable[[argparse.ArgumentParser], None]] = {"budget": _budget}
