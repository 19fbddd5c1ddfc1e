"""Whose runs a read through the front may see: those one principal started, or every run (an
operator's). A run records the front principal whose bearer token started it (`runs.principal`;
a sub-agent run has its parent's); a run started inside the deployment (client API, cron, Teams,
jobs) has none, so only an operator sees it. A run out of scope reads as one that does not
exist, so its id says nothing to whoever guessed it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa

from store.db import sql


@dataclass(frozen=True)
class Scope:
    """Who reads (`principal`, a front token's) and whether it sees every run (`every`)."""

    principal: str
    every: bool = False

    def sees(self, alias: str) -> str:
        """A condition true for the rows of `alias` (a table with a `principal` column) this
        scope sees; bind `params()` with it."""
        return f"(CAST(:scope_every AS boolean) OR {alias}.principal = :scope_principal)"

    def own_first(self, alias: str) -> str:
        """An ORDER BY term putting the reader's own rows of `alias` first."""
        return f"({alias}.principal IS NOT DISTINCT FROM CAST(:scope_principal AS text)) DESC"

    def params(self) -> dict[str, Any]:
        return {"scope_every": self.every, "scope_principal": self.principal}


def run_in_scope(conn: sa.Connection, run_id: str, scope: Scope) -> bool:
    """True when the run exists and `scope` sees it (a missing run and an unseen one alike are
    False: the caller answers both the same way)."""
    row = conn.execute(
        sql(f"SELECT 1 FROM runs r WHERE r.id = CAST(:id AS uuid) AND {scope.sees('r')}"),
        {"id": run_id, **scope.params()},
    ).first()
    return row is not None
