"""A user's tool module declaring a raw `Tool` (no typed wrapper) whose read runs SQL with the
model's text as a parameter, so a value Postgres refuses raises a database error quoting the
user's text straight into the engine: the case that must reach no log line or audit row.
Loaded by workers with LIYAGENT_TOOLS."""

from __future__ import annotations

import os
from typing import Any

import sqlalchemy as sa

from liyagent import CallContext, Tool, ToolKind
from store import db


def _lookup(args: dict[str, Any], ctx: CallContext) -> dict[str, Any]:
    engine = db.engine_for(os.environ["LIYAGENT_DATABASE_URL"])
    with engine.connect() as conn:
        value = conn.execute(
            sa.text("SELECT CAST(:a AS integer)"), {"a": str(args.get("account"))}
        ).scalar_one()
    return {"account": value}


LEDGER_LOOKUP = Tool(
    name="ledger.lookup",
    kind=ToolKind.READ,
    description="Look an account number up (an integer; anything else is a database error).",
    invoke=_lookup,
)
