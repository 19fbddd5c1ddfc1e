"""Runs that wait: approvals, delegation to child runs, suspend and wake.

A waiting run holds no worker and no lease. Whatever it waits for wakes it with one
conditional statement (waiting -> queued, attempt + 1); the sweeper wakes any run whose wait
is over but whose wake was missed, so a lost message or a race only delays it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import sqlalchemy as sa

from store.budgets import WAKE_SQL as BUDGET_WAKE_SQL
from store.db import sql, to_json
from store.rows import ApprovalRow, Attempt, FencedOut, RunId
from store.runs import OWNER_CTE
from store.states import ApprovalStatus
from store.workflow_events import WAKE_SQL as EVENT_WAKE_SQL

_APPROVAL_COLUMNS = (
    "id, run_id, step, call_index, step_key, tool, args, status, decided_by, reason, "
    "created_at, decided_at"
)


def _approval(fields: Mapping[Any, Any]) -> ApprovalRow:
    return ApprovalRow(**{**fields, "status": ApprovalStatus(fields["status"])})


def ensure_approval(
    conn: sa.Connection,
    *,
    run_id: str,
    attempt: int,
    approval_id: str,
    step: int,
    call_index: int,
    step_key: str,
    tool: str,
    args: dict[str, Any],
) -> ApprovalRow:
    """File the approval request for this step key, or return the one already filed (a
    resume routing the call again coalesces with it); fenced on the attempt (I3)."""
    row = conn.execute(
        sql(
            f"""
            WITH {OWNER_CTE},
            ins AS (
                INSERT INTO approvals (id, run_id, step, call_index, step_key, tool, args)
                SELECT :id, id, :step, :call_index, :step_key, :tool, CAST(:args AS jsonb)
                FROM owner
                ON CONFLICT (step_key) DO NOTHING
                RETURNING {_APPROVAL_COLUMNS})
            SELECT {_APPROVAL_COLUMNS} FROM ins
            UNION ALL
            SELECT {_APPROVAL_COLUMNS} FROM approvals
            WHERE step_key = :step_key AND EXISTS (SELECT 1 FROM owner)
              AND NOT EXISTS (SELECT 1 FROM ins)
            """
        ),
        {
            "run_id": run_id,
            "attempt": attempt,
            "id": approval_id,
            "step": step,
            "call_index": call_index,
            "step_key": step_key,
            "tool": tool,
            "args": json.dumps(args, sort_keys=True),
        },
    ).first()
    if row is None:
        raise FencedOut(run_id, attempt, f"file the approval for {tool}")
    return _approval(row._mapping)


def get_approval(conn: sa.Connection, approval_id: str) -> ApprovalRow | None:
    row = conn.execute(
        sql(f"SELECT {_APPROVAL_COLUMNS} FROM approvals WHERE id = :id"), {"id": approval_id}
    ).first()
    return None if row is None else _approval(row._mapping)


def list_approvals(conn: sa.Connection, run_id: str) -> list[ApprovalRow]:
    rows = conn.execute(
        sql(f"SELECT {_APPROVAL_COLUMNS} FROM approvals WHERE run_id = :r ORDER BY created_at"),
        {"r": run_id},
    ).all()
    return [_approval(r._mapping) for r in rows]


def decide_approval(
    conn: sa.Connection, approval_id: str, *, approve: bool, by: str, reason: str | None
) -> tuple[ApprovalRow, Attempt | None] | None:
    """Decide a pending request once, and wake its run if it is waiting on it, in one
    statement. None if it was already decided (or does not exist)."""
    row = conn.execute(
        sql(
            f"""
            WITH d AS (
                UPDATE approvals SET status = :status, decided_by = :by, reason = :reason,
                       decided_at = now()
                WHERE id = :id AND status = 'pending'
                RETURNING {_APPROVAL_COLUMNS}),
            w AS (
                UPDATE runs SET status = 'queued', attempt = attempt + 1, deliveries = 0,
                       resume_reason = 'approval', waiting_on = NULL, queued_at = now(),
                       updated_at = now()
                FROM d
                WHERE runs.id = d.run_id AND runs.status = 'waiting'
                  AND runs.waiting_on = 'approval:' || d.id
                RETURNING runs.id, runs.attempt),
            a AS (
                INSERT INTO audit_events (run_id, kind, step, detail)
                SELECT run_id, 'agent.approval.decided', step,
                       jsonb_build_object('approval_id', id, 'status', status, 'by', decided_by,
                                          'reason', reason)
                FROM d)
            SELECT d.*, w.attempt AS woke FROM d LEFT JOIN w ON w.id = d.run_id
            """
        ),
        {
            "id": approval_id,
            "status": ApprovalStatus.APPROVED if approve else ApprovalStatus.DENIED,
            "by": by,
            "reason": reason,
        },
    ).first()
    if row is None:
        return None
    fields = {k: v for k, v in row._mapping.items() if k != "woke"}
    return _approval(fields), (None if row.woke is None else Attempt(row.woke))


def suspend(
    conn: sa.Connection,
    run_id: str,
    attempt: int,
    waiting_on: str,
    step: int,
    detail: dict[str, Any] | None = None,
) -> None:
    """The running attempt ends its task and waits (no worker, no lease), audited (`detail`
    added to the audit: what a model wait waits for, in its own words)."""
    row = conn.execute(
        sql(
            """
            WITH s AS (
                UPDATE runs SET status = 'waiting', waiting_on = :on, updated_at = now()
                WHERE id = :run_id AND attempt = :attempt AND status = 'running'
                RETURNING id, attempt, claimed_by, claimed_at),
            a AS (
                INSERT INTO audit_events (run_id, kind, attempt, step, detail)
                SELECT id, 'agent.run.waiting', attempt, :step,
                       CAST(:detail AS jsonb) || jsonb_build_object(
                           'waiting_on', :on, 'worker', claimed_by, 'claimed_at', claimed_at)
                FROM s)
            SELECT id FROM s
            """
        ),
        {
            "run_id": run_id,
            "attempt": attempt,
            "on": waiting_on,
            "step": step,
            "detail": to_json(detail or {}),
        },
    ).first()
    if row is None:
        raise FencedOut(run_id, attempt, f"wait on {waiting_on}")


def wake_parent(conn: sa.Connection, child_id: str) -> tuple[RunId, Attempt] | None:
    """Wake the run waiting on this child, once."""
    row = conn.execute(
        sql(
            """
            UPDATE runs SET status = 'queued', attempt = attempt + 1, deliveries = 0,
                   resume_reason = 'child_done', waiting_on = NULL, queued_at = now(),
                   updated_at = now()
            WHERE status = 'waiting' AND waiting_on = 'child:' || :child
            RETURNING id, attempt
            """
        ),
        {"child": child_id},
    ).first()
    return None if row is None else (RunId(row.id), Attempt(row.attempt))


def wake_ready(conn: sa.Connection) -> list[tuple[RunId, Attempt]]:
    """Wake every waiting run whose approval was decided, whose child ended, whose timer is
    due, whose signal came (or its wait timed out), whose model endpoint has opened, whose
    retry for a worker that serves its pin is due, or whose budget was raised or its period
    turned (the sweeper's backstop for a wake that was missed, and the clock of timers and
    closes)."""
    rows = conn.execute(
        sql(
            f"""
            UPDATE runs r SET status = 'queued', attempt = attempt + 1, deliveries = 0,
                   resume_reason = 'wait_over', waiting_on = NULL, queued_at = now(),
                   updated_at = now()
            WHERE r.status = 'waiting' AND (
                EXISTS (SELECT 1 FROM approvals a WHERE r.waiting_on = 'approval:' || a.id
                        AND a.status <> 'pending')
                OR EXISTS (SELECT 1 FROM runs c WHERE r.waiting_on = 'child:' || c.id
                           AND c.status IN ('succeeded', 'failed'))
                OR (r.waiting_on LIKE 'timer:%'
                    AND to_timestamp(CAST(split_part(r.waiting_on, ':', 2) AS float8)) <= now())
                -- A model endpoint closed by a 429 (model:<profile>:<opens at>): runtime/flow/.
                OR (r.waiting_on LIKE 'model:%'
                    AND to_timestamp(CAST(split_part(r.waiting_on, ':', 3) AS float8)) <= now())
                -- A wait for a worker whose code serves its pin (definition:<pin>:<retry at>).
                OR (r.waiting_on LIKE 'definition:%'
                    AND to_timestamp(CAST(split_part(r.waiting_on, ':', 3) AS float8)) <= now())
                -- A signal sent (signal:<name>:<deadline or never>), or its wait timed out.
                OR (split_part(r.waiting_on, ':', 1) = 'signal' AND (
                    EXISTS (SELECT 1 FROM signals g WHERE g.run_id = r.id AND g.taken_by IS NULL
                            AND g.name = split_part(r.waiting_on, ':', 2))
                    OR (split_part(r.waiting_on, ':', 3) <> 'never'
                        AND to_timestamp(CAST(split_part(r.waiting_on, ':', 3) AS float8))
                            <= now())))
                -- An event published (event:<digest>:<since>:<deadline or never>), or timed out.
                OR {EVENT_WAKE_SQL}
                -- A budget raised, or whose period has turned (store/budgets.py).
                OR ({BUDGET_WAKE_SQL}))
            RETURNING r.id, r.attempt
            """
        )
    ).all()
    return [(RunId(r.id), Attempt(r.attempt)) for r in rows]


def hold_owner(conn: sa.Connection, run_id: str, attempt: int) -> bool:
    """Hold the run's row (FOR SHARE, until the caller's transaction ends) while this attempt
    still owns it, running: what a sub-agent's run is inserted under, so a parent taken over
    (a claim, an erasure) meanwhile stores no child (I3). False: the attempt no longer owns it."""
    row = conn.execute(
        sql(
            "SELECT id FROM runs WHERE id = CAST(:run_id AS uuid) AND attempt = :attempt "
            "AND status = 'running' FOR SHARE"
        ),
        {"run_id": run_id, "attempt": attempt},
    ).first()
    return row is not None
