"""A running attempt's give-back after Postgres went away under it (a store fault, not a loss):
the run queued again as a new attempt by the process that still holds its lease, and what that
attempt may have been billed for a step it never wrote recorded as unconfirmed usage, in the
same statement."""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa

from store.db import sql
from store.ledger import Note, note_params, unconfirmed_cte
from store.rows import Attempt, FencedOut


def hand_back_store_fault(
    conn: sa.Connection,
    run_id: str,
    attempt: int,
    worker: str,
    what: str,
    unconfirmed: Sequence[Note] = (),
) -> Attempt:
    """Give back a run whose attempt was stopped by Postgres going away (`what` it was doing),
    once Postgres answers again, as a new attempt, from the process that still holds its
    lease: one statement matching only this attempt while running or answered (I3, I4). No
    loss is charged (`lost_count` is left as it is: the process lived), the resume reason is
    `store_fault` and it is audited as `agent.run.store_fault`; an answered run stays answered
    so its answer is handed on, never produced again. The resume reads Postgres to settle
    whatever the lost commit left (its checkpoint chain, its marks in doubt).

    `unconfirmed`: what this attempt may have been billed for the steps it asked (the exact
    usage of an answer it holds, else its note's bound: runtime/core/executor.py). No claim of
    a loss follows a give-back, so nothing else records them: each is recorded here for a step
    the run has not written when no answer is stored (the commit the fault cut short may have
    landed: then its step, or its answer, holds the usage exactly and nothing is recorded)."""
    # One conditional statement (I4: the give-back, its audit and its unconfirmed usage happen
    # once, or not at all when another attempt owns the run; the key (run, attempt, step)
    # refuses a second record of one step).
    row = conn.execute(
        sql(
            f"""
            WITH h AS (
                UPDATE runs SET attempt = attempt + 1, deliveries = 0,
                       status = CASE WHEN status = 'answered' THEN 'answered' ELSE 'queued' END,
                       resume_reason = 'store_fault', queued_at = now(), updated_at = now()
                WHERE id = :run_id AND attempt = :attempt AND status IN ('running', 'answered')
                RETURNING id, attempt, step, lost_count, claimed_at,
                          answer IS NOT NULL AS answered),{unconfirmed_cte("h")}
            a AS (
                INSERT INTO audit_events (run_id, kind, attempt, step, detail)
                SELECT id, 'agent.run.store_fault', attempt, step,
                       jsonb_build_object('reason', 'store_fault', 'lost_count', lost_count,
                                          'faulted_attempt', attempt - 1,
                                          'faulted_claimed_at', claimed_at,
                                          'answered', answered,
                                          'holder', CAST(:worker AS text),
                                          'seen', 'postgres_unreachable',
                                          'error', CAST(:what AS text))
                FROM h)
            SELECT attempt FROM h
            """
        ),
        {
            "run_id": run_id,
            "attempt": attempt,
            "worker": worker,
            "what": what,
            **note_params(unconfirmed),
        },
    ).first()
    if row is None:
        raise FencedOut(run_id, attempt, "give the run back after a store fault")
    return Attempt(row.attempt)
