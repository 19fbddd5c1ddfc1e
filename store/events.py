"""The rows a run's events are derived from, read in one statement (one snapshot, one round
trip): the run's row, its lifecycle audit, its step records, its call marks and its
approvals. Nothing here writes, and nothing is recorded for events' sake: every fact is a row
the engine's guarded statements write anyway (runtime/ops/events.py turns them into events
with their sequence numbers).

One snapshot matters: the derivation judges some events by what else is there (a claim by the
records of its attempt), so every fact must come from the same moment.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import sqlalchemy as sa

from store.db import sql
from store.rows import RunNotFound

# The audit kinds that are a run's lifecycle (an operator's Stop, a lifted Stop, a delegation
# or an answer that did not verify are other things' records; a settled or failed call is read
# from its mark, which says the same).
LIFECYCLE_AUDIT = (
    "agent.run.lost",
    "agent.run.failed",
    "agent.run.handed_back",
    "agent.run.store_fault",
    "agent.run.waiting",
    "agent.run.crash_resumed",
    "agent.run.resumed",
    "agent.run.error",
    # A step's wait in place on its model endpoint, and a 429 it met (runtime/core/model_gate.py).
    "agent.run.endpoint_wait",
    "agent.run.rate_limited",
    # The code a worker ran did not serve its pinned definition (runtime/core/drift.py).
    "agent.run.definition_drift",
)


@dataclass(frozen=True)
class RunFact:
    """The run's row, as far as its events need it."""

    status: str
    attempt: int
    created_at: datetime
    claimed_by: str | None
    claimed_at: datetime | None
    answered_at: datetime | None
    finished_at: datetime | None
    failure_reason: str | None
    # The database clock when this was read.
    read_at: datetime
    # The final answer's usage as written with it (store/usage.py), {} when none was reported.
    answer_usage: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class AuditFact:
    id: int
    kind: str
    attempt: int | None
    step: int | None
    detail: dict[str, Any]
    at: datetime


@dataclass(frozen=True)
class StepFact:
    step: int
    attempt: int
    at: datetime
    # Its usage as written with it (store/usage.py), {} when none was reported.
    usage: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class MarkFact:
    step: int
    call_index: int
    call_id: str
    tool: str
    kind: str
    status: str
    settlement: str | None
    # The attempt that last wrote it, and the one that first marked it (and when).
    attempt: int
    first_attempt: int
    first_marked_at: datetime
    settled_at: datetime | None


@dataclass(frozen=True)
class ApprovalFact:
    id: str
    step: int
    call_index: int
    tool: str
    status: str
    decided_by: str | None
    decided_at: datetime | None


@dataclass(frozen=True)
class RunFacts:
    """Everything Postgres holds that a run's events are derived from."""

    run_id: str
    run: RunFact
    audit: tuple[AuditFact, ...]
    steps: tuple[StepFact, ...]
    marks: tuple[MarkFact, ...]
    approvals: tuple[ApprovalFact, ...]


# A row's usage columns (`prefix`: `answer_` on the run's row) as one JSON object, without
# those that are NULL (a cost as text: exact to the billionth).
_USAGE_JSON = """jsonb_strip_nulls(jsonb_build_object(
    'input_tokens', {p}input_tokens, 'output_tokens', {p}output_tokens,
    'cached_tokens', {p}cached_tokens, 'model', {p}model,
    'cost_usd', CAST({p}cost_usd AS text)))"""
# One statement: a row per fact, tagged by its source, in one shape (unused columns NULL).
_FACTS_SQL = f"""
    SELECT 'run' AS src, status AS kind, attempt, NULL::int AS step, NULL::int AS idx,
           created_at AS t1, claimed_at AS t2, answered_at AS t3, finished_at AS t4,
           claimed_by AS who, NULL::text AS what, failure_reason AS why, NULL::text AS how,
           NULL::int AS n, {_USAGE_JSON.format(p="answer_")} AS detail, 0::bigint AS id,
           clock_timestamp() AS read_at
    FROM runs WHERE id = CAST(:id AS uuid)
    UNION ALL
    SELECT 'audit', kind, attempt, step, NULL, created_at, NULL, NULL, NULL, NULL, NULL,
           NULL, NULL, NULL, detail, id, NULL
    FROM audit_events WHERE run_id = CAST(:id AS uuid) AND kind = ANY(:kinds)
    UNION ALL
    SELECT 'step', NULL, attempt, step, NULL, created_at, NULL, NULL, NULL, NULL, NULL, NULL,
           NULL, NULL, {_USAGE_JSON.format(p="")}, 0, NULL
    FROM run_steps WHERE run_id = CAST(:id AS uuid)
    UNION ALL
    SELECT 'mark', status, attempt, step, call_index, coalesce(first_marked_at, marked_at),
           settled_at, NULL, NULL, call_id, tool, kind, settlement,
           coalesce(first_attempt, attempt), NULL, 0, NULL
    FROM call_marks WHERE run_id = CAST(:id AS uuid)
    UNION ALL
    SELECT 'approval', status, NULL, step, call_index, created_at, decided_at, NULL, NULL,
           decided_by, tool, CAST(id AS text), NULL, NULL, NULL, 0, NULL
    FROM approvals WHERE run_id = CAST(:id AS uuid)
"""


def select_run_facts(conn: sa.Connection, run_id: str) -> RunFacts:
    """The facts of one run, in one statement; RunNotFound when no run has this id."""
    rows = conn.execute(sql(_FACTS_SQL), {"id": run_id, "kinds": list(LIFECYCLE_AUDIT)}).all()
    run: RunFact | None = None
    audit: list[AuditFact] = []
    steps: list[StepFact] = []
    marks: list[MarkFact] = []
    approvals: list[ApprovalFact] = []
    for r in rows:
        if r.src == "run":
            run = RunFact(
                r.kind, r.attempt, r.t1, r.who, r.t2, r.t3, r.t4, r.why, r.read_at, dict(r.detail)
            )
        elif r.src == "audit":
            audit.append(AuditFact(r.id, r.kind, r.attempt, r.step, dict(r.detail or {}), r.t1))
        elif r.src == "step":
            steps.append(StepFact(r.step, r.attempt, r.t1, dict(r.detail)))
        elif r.src == "mark":
            marks.append(
                MarkFact(
                    r.step,
                    r.idx,
                    r.who,
                    r.what,
                    r.why,
                    r.kind,
                    r.how,
                    r.attempt,
                    r.n,
                    r.t1,
                    r.t2,
                )
            )
        else:
            approvals.append(ApprovalFact(r.why, r.step, r.idx, r.what, r.kind, r.who, r.t2))
    if run is None:
        raise RunNotFound(run_id)
    return RunFacts(
        run_id,
        run,
        tuple(sorted(audit, key=lambda a: a.id)),
        tuple(steps),
        tuple(marks),
        tuple(approvals),
    )
