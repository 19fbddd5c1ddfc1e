"""The ledger's statements beyond a step's own write (issue 34): unconfirmed usage recorded by
the claim of a loss, and the roll-ups by agent, owner, tenant and day.

Unconfirmed usage is what a lost attempt reserved for a step it never wrote (its input bound,
its max_tokens, runtime/fleet/usage_notes.py): the provider may have billed up to that for a
request whose answer was lost with the attempt. It is kept apart from the exact usage of
written steps, never merged into it: a resume that asks that step again and writes it is a
second billed request, counted exactly in the step it writes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

import sqlalchemy as sa

from store.db import sql


@dataclass(frozen=True)
class Note:
    """What one attempt reserved for the step it asked (runtime/fleet/usage_notes.py): the
    step, the bounds of its input and output tokens, the model asked for, and the bounds' cost
    at the prices in force (None: unpriced, or no model named)."""

    run_id: str
    attempt: int
    step: int
    input_tokens: int
    output_tokens: int
    model: str | None
    cost_usd: Decimal | None


def unconfirmed_cte(claimed: str) -> str:
    """A claim statement's CTE, or a store fault's give-back's (store/store_faults.py) (I4: it
    records only in the statement that wins the claim): each note of an attempt the claim
    `claimed` (RETURNING id, attempt, step, answered) just fenced out is recorded as
    unconfirmed usage when its step was not written (after the run's last written step, and no
    answer stored). A duplicate claim matches no run, so it records nothing; the primary key
    (run, attempt, step) refuses a second record of one note."""
    return f"""
            unconfirmed AS (
                INSERT INTO usage_unconfirmed (run_id, attempt, step, input_tokens,
                                               output_tokens, model, cost_usd)
                SELECT n.run_id, n.attempt, n.step, n.i, n.o, n.model, n.usd
                FROM unnest(CAST(:note_runs AS uuid[]), CAST(:note_attempts AS int[]),
                            CAST(:note_steps AS int[]), CAST(:note_inputs AS int[]),
                            CAST(:note_outputs AS int[]), CAST(:note_models AS text[]),
                            CAST(:note_costs AS numeric[]))
                    AS n(run_id, attempt, step, i, o, model, usd)
                JOIN {claimed} ON {claimed}.id = n.run_id AND {claimed}.attempt = n.attempt + 1
                WHERE n.step > {claimed}.step AND NOT {claimed}.answered
                ON CONFLICT (run_id, attempt, step) DO NOTHING),"""


def note_params(notes: Sequence[Note]) -> dict[str, Any]:
    """The bind parameters `unconfirmed_cte` reads."""
    return {
        "note_runs": [n.run_id for n in notes],
        "note_attempts": [n.attempt for n in notes],
        "note_steps": [n.step for n in notes],
        "note_inputs": [n.input_tokens for n in notes],
        "note_outputs": [n.output_tokens for n in notes],
        "note_models": [n.model for n in notes],
        "note_costs": [n.cost_usd for n in notes],
    }


# Every usage row with when it was recorded and whose run it is: written steps' and final
# answers' exact usage, and lost attempts' unconfirmed reservations. Read by the report and the
# metrics only (no index of its own: a report scans the rows of its period).
_USAGE_ROWS = """
    SELECT s.run_id, s.created_at AS at, false AS unconfirmed, s.input_tokens AS i,
           s.output_tokens AS o, coalesce(s.cached_tokens, 0) AS c, s.cost_usd AS usd,
           s.model IS NOT NULL AND s.cost_usd IS NULL AS unpriced
    FROM run_steps s WHERE s.input_tokens IS NOT NULL AND s.created_at >= :since
    UNION ALL
    SELECT id, answered_at, false, answer_input_tokens, answer_output_tokens,
           coalesce(answer_cached_tokens, 0), answer_cost_usd,
           answer_model IS NOT NULL AND answer_cost_usd IS NULL
    FROM runs WHERE answer_input_tokens IS NOT NULL AND answered_at >= :since
    UNION ALL
    SELECT run_id, recorded_at, true, input_tokens, output_tokens, 0, cost_usd, cost_usd IS NULL
    FROM usage_unconfirmed WHERE recorded_at >= :since"""

# What a report groups by: the run's agent, owner or tenant (a run stored before tenants
# existed: its owner's), or the UTC day the usage was recorded.
GROUPS = {
    "agent": "r.agent",
    "owner": "r.owner",
    "tenant": "coalesce(r.tenant, r.owner)",
    "day": "to_char(x.at AT TIME ZONE 'UTC', 'YYYY-MM-DD')",
}


@dataclass(frozen=True)
class UsageLine:
    """One group's usage in a period: exact (written steps) and unconfirmed (lost attempts'
    reservations) apart; `unpriced` rows count their tokens, not their cost."""

    key: str
    runs: int
    input_tokens: int
    output_tokens: int
    cached_tokens: int
    unconfirmed_input_tokens: int
    unconfirmed_output_tokens: int
    cost_usd: Decimal
    unconfirmed_cost_usd: Decimal
    unpriced: int

    def to_json(self) -> dict[str, Any]:
        out = {name: getattr(self, name) for name in self.__dataclass_fields__}
        out["cost_usd"] = f"{self.cost_usd:f}"
        out["unconfirmed_cost_usd"] = f"{self.unconfirmed_cost_usd:f}"
        return out


_SUMS = """
    count(DISTINCT x.run_id) AS runs,
    coalesce(sum(x.i) FILTER (WHERE NOT x.unconfirmed), 0) AS i,
    coalesce(sum(x.o) FILTER (WHERE NOT x.unconfirmed), 0) AS o,
    coalesce(sum(x.c) FILTER (WHERE NOT x.unconfirmed), 0) AS c,
    coalesce(sum(x.i) FILTER (WHERE x.unconfirmed), 0) AS ui,
    coalesce(sum(x.o) FILTER (WHERE x.unconfirmed), 0) AS uo,
    coalesce(sum(x.usd) FILTER (WHERE NOT x.unconfirmed), 0) AS usd,
    coalesce(sum(x.usd) FILTER (WHERE x.unconfirmed), 0) AS uusd,
    count(*) FILTER (WHERE x.unpriced) AS unpriced"""


def usage_by(
    conn: sa.Connection,
    by: str,
    since: datetime,
    *,
    principal: str | None = None,
    agent: str | None = None,
    tenant: str | None = None,
) -> list[UsageLine]:
    """Usage recorded since `since`, grouped `by` (a `GROUPS` key), in one query: of the runs
    the front principal `principal` started when given (None: every run), of one agent or one
    tenant when given. A child run's usage is its own agent's and counts once."""
    if by not in GROUPS:
        raise ValueError(f"by: one of {', '.join(GROUPS)}, not {by!r}")
    rows = conn.execute(
        sql(
            f"""
            SELECT {GROUPS[by]} AS key, {_SUMS}
            FROM ({_USAGE_ROWS}) x JOIN runs r ON r.id = x.run_id
            WHERE (CAST(:principal AS text) IS NULL OR r.principal = :principal)
              AND (CAST(:agent AS text) IS NULL OR r.agent = :agent)
              AND (CAST(:tenant AS text) IS NULL OR coalesce(r.tenant, r.owner) = :tenant)
            GROUP BY 1 ORDER BY 1
            """
        ),
        {"since": since, "principal": principal, "agent": agent, "tenant": tenant},
    ).all()
    return [
        UsageLine(
            key=str(r.key), runs=int(r.runs), input_tokens=int(r.i), output_tokens=int(r.o),
            cached_tokens=int(r.c), unconfirmed_input_tokens=int(r.ui),
            unconfirmed_output_tokens=int(r.uo), cost_usd=Decimal(r.usd),
            unconfirmed_cost_usd=Decimal(r.uusd), unpriced=int(r.unpriced),
        )
        for r in rows
    ]  # fmt: skip


def usage_by_tenant(conn: sa.Connection) -> list[UsageLine]:
    """Every usage row Postgres holds, by tenant (the metrics' counters, read at scrape)."""
    return usage_by(conn, "tenant", datetime(1970, 1, 1, tzinfo=UTC))


@dataclass(frozen=True)
class LedgerEntry:
    """One usage row of a run, as `inspect` lists it: a written step's (or its final answer's)
    exact usage, or a lost attempt's unconfirmed reservation."""

    step: int
    # The attempt that wrote it (None for a final answer's: its row keeps no writer).
    attempt: int | None
    unconfirmed: bool
    input_tokens: int | None
    output_tokens: int | None
    cached_tokens: int | None
    model: str | None
    cost_usd: Decimal | None

    def to_json(self) -> dict[str, Any]:
        out = {name: getattr(self, name) for name in self.__dataclass_fields__}
        out["cost_usd"] = None if self.cost_usd is None else f"{self.cost_usd:f}"
        return out


def run_ledger(conn: sa.Connection, run_id: str) -> list[LedgerEntry]:
    """Every usage row of one run, by step then attempt (one query)."""
    rows = conn.execute(
        sql(
            """
            SELECT step, attempt, false AS unconfirmed, input_tokens, output_tokens,
                   cached_tokens, model, cost_usd
            FROM run_steps WHERE run_id = :id AND input_tokens IS NOT NULL
            UNION ALL
            SELECT step + 1, NULL, false, answer_input_tokens, answer_output_tokens,
                   answer_cached_tokens, answer_model, answer_cost_usd
            FROM runs WHERE id = :id AND answer_input_tokens IS NOT NULL
            UNION ALL
            SELECT step, attempt, true, input_tokens, output_tokens, NULL, model, cost_usd
            FROM usage_unconfirmed WHERE run_id = :id
            ORDER BY 1, 2, 3
            """
        ),
        {"id": run_id},
    ).all()
    return [LedgerEntry(*r) for r in rows]
