"""A2A's statements: the task a run stands for (linked in the run's inserting statement,
ended in its ending one), GetTask and ListTasks, CancelTask's mark."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

import sqlalchemy as sa

from store.db import sql
from store.entry_links import EntryLink
from store.scope import Scope

KIND = "a2a"


def a2a_link(
    task_id: str, *, context_id: str | None = None, message: str | None = None
) -> EntryLink:
    """The run's A2A task (named after the message that created it, with its context id and
    that message as received, JSON text), inserted with the run."""
    return EntryLink(
        KIND,
        "link AS (INSERT INTO a2a_tasks (id, run_id, principal, context_id, message) "
        "SELECT :link_ref, id, principal, :link_context, CAST(:link_message AS jsonb) "
        "FROM r)",
        {"link_ref": task_id, "link_context": context_id, "link_message": message},
    )


def a2a_end(source: str, *, success: bool, outcome_sql: str, where: str) -> str:
    """The task completed with the answer, or failed with the reason (`EntryEnd`)."""
    state = "completed" if success else "failed"
    return f"""e_a2a AS (
        UPDATE a2a_tasks SET status = '{state}', answer = {outcome_sql}, updated_at = now()
        FROM {source} WHERE a2a_tasks.run_id = {source}.id AND {where})"""


# The A2A task state a run stands in (protocol names; the front maps them to its enum): the
# run's end first, then a Stop asked for by CancelTask, then what a live run waits for.
TASK_STATE_SQL = """CASE
    WHEN r.status = 'succeeded' THEN 'completed'
    WHEN r.status = 'failed' AND t.canceled_at IS NOT NULL THEN 'canceled'
    WHEN r.status = 'failed' THEN 'failed'
    WHEN r.status = 'waiting' AND r.waiting_on LIKE 'approval:%' THEN 'auth-required'
    WHEN r.status = 'queued' AND r.started_at IS NULL THEN 'submitted'
    WHEN r.status = 'waiting' AND r.waiting_on = 'tenant' THEN 'submitted'
    ELSE 'working' END"""

_TASK_SELECT = f"""
    SELECT t.id, t.run_id, t.context_id, t.message, t.answer, t.canceled_at, t.created_at,
           greatest(t.updated_at, r.updated_at) AS updated_at, r.agent, r.status AS run_status,
           r.waiting_on, r.failure_reason, {TASK_STATE_SQL} AS state
    FROM a2a_tasks t JOIN runs r ON r.id = t.run_id"""


@dataclass(frozen=True)
class A2ATask:
    """An A2A task with the state of its run: what GetTask and ListTasks answer from."""

    id: str
    run_id: str
    context_id: str | None
    message: dict[str, Any] | None
    answer: str | None
    canceled_at: datetime | None
    created_at: datetime
    updated_at: datetime
    agent: str
    run_status: str
    waiting_on: str | None
    failure_reason: str | None
    # submitted, working, auth-required, completed, failed or canceled (TASK_STATE_SQL).
    state: str


def get_a2a_task(conn: sa.Connection, task_id: str, scope: Scope) -> A2ATask | None:
    """The A2A task `task_id` as `scope` sees it (ids are unique per principal: the reader's
    own task first, else the first made), with its run's state; None when it sees none."""
    row = conn.execute(
        sql(
            f"{_TASK_SELECT} WHERE t.id = :id AND {scope.sees('t')} "
            f"ORDER BY {scope.own_first('t')}, t.created_at, t.run_id LIMIT 1"
        ),
        {"id": task_id, **scope.params()},
    ).first()
    return None if row is None else A2ATask(**row._mapping)


def list_a2a_tasks(
    conn: sa.Connection,
    *,
    scope: Scope,
    limit: int,
    context_id: str | None = None,
    state: str | None = None,
    updated_after: datetime | None = None,
    before: tuple[datetime, str] | None = None,
) -> tuple[list[A2ATask], int]:
    """A page of the A2A tasks `scope` sees, newest first, after the cursor `before`
    (created_at, id); with the number of those tasks the filters match in all."""
    where = [scope.sees("t"), "(CAST(:ctx AS text) IS NULL OR t.context_id = :ctx)"]
    where.append(f"(CAST(:state AS text) IS NULL OR {TASK_STATE_SQL} = :state)")
    where.append(
        "(CAST(:after AS timestamptz) IS NULL OR greatest(t.updated_at, r.updated_at) > :after)"
    )
    params: dict[str, Any] = {
        "ctx": context_id,
        "state": state,
        "after": updated_after,
        **scope.params(),
    }
    total = conn.execute(
        sql(
            "SELECT count(*) FROM a2a_tasks t JOIN runs r ON r.id = t.run_id WHERE "
            + " AND ".join(where)
        ),
        params,
    ).scalar_one()
    if before is not None:
        where.append("(t.created_at, t.id) < (:b_at, :b_id)")
        params |= {"b_at": before[0], "b_id": before[1]}
    rows = conn.execute(
        sql(
            f"{_TASK_SELECT} WHERE {' AND '.join(where)} "
            "ORDER BY t.created_at DESC, t.id DESC LIMIT :n"
        ),
        {**params, "n": limit},
    ).all()
    return [A2ATask(**r._mapping) for r in rows], int(total)


def mark_a2a_canceled(conn: sa.Connection, run_id: str) -> bool:
    """Record that CancelTask stopped this run's task (once; only while the run has not ended),
    so the run's failure is reported as canceled."""
    row = conn.execute(
        sql(
            """
            UPDATE a2a_tasks SET canceled_at = now(), updated_at = now()
            FROM runs r
            WHERE a2a_tasks.run_id = CAST(:run_id AS uuid) AND r.id = a2a_tasks.run_id
              AND a2a_tasks.canceled_at IS NULL
              AND (r.status NOT IN ('succeeded', 'failed') OR r.failure_reason LIKE 'stopped by%')
            RETURNING a2a_tasks.id
            """
        ),
        {"run_id": run_id},
    ).first()
    return row is not None
