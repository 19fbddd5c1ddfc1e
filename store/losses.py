"""Claiming a run whose attempt is lost (its lease lapsed, its process died, it gave its lease
up) or cut off by a store fault: one conditional statement per batch, bumping the attempt so
the lost one is fenced out (I3), of two claims one wins (I4), audited in the same statement; a
run lost more than its limit, or not written ahead, is failed with the reason instead, told to
its entry points. And how a loss was seen, for the traces."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa

from store.db import sql
from store.entries import ends_cte
from store.ledger import Note, note_params, unconfirmed_cte
from store.rows import Attempt, ClaimResult, RunId
from store.states import RunStatus, Seen

_CLAIMED_TAIL = f"""t AS (
                INSERT INTO transcript_messages (run_id, role, content)
                SELECT id, 'notice', 'This run failed: ' || failure_reason
                FROM c WHERE status = 'failed')
            {
    ends_cte("c", success=False, outcome_sql="c.failure_reason", where="c.status = 'failed'")
}
            SELECT id, attempt, status, lost_count, step FROM c"""


def _claim_results(rows: Any) -> list[ClaimResult]:
    return [
        ClaimResult(
            run_id=RunId(r.id),
            attempt=Attempt(r.attempt),
            status=RunStatus(r.status),
            lost_count=r.lost_count,
            step=r.step,
        )
        for r in rows
    ]


# Resumed runs first (runtime/flow/order.py): each lost run queued again by a claim asks one
# running first attempt (never resumed, so never asked before: no ping-pong), the youngest, to
# yield its slot to it at its next step boundary, in the claim's own statement. An ask that
# fell on a run lost since (a dead process's pool children are claimed one holder at a time,
# and its runs are the youngest) is passed on by the claim that takes that run. Runs another
# claimer or a checkpoint holds locked are skipped, never waited for; a run already asked for
# a run still queued is not asked again. Agents and workflows only (they reach boundaries),
# written ahead only (a yielded run resumes from its checkpoint).
_ASK_YIELDS = """,
            lost AS (
                SELECT id, row_number() OVER (ORDER BY id) AS n FROM (
                    SELECT id FROM c WHERE status = 'queued'
                    UNION
                    SELECT q.id FROM picked p JOIN runs q ON q.id = p.asked_for
                    WHERE q.status = 'queued') l),
            yielders AS (
                SELECT id, row_number() OVER (ORDER BY claimed_at DESC, id) AS n FROM (
                    SELECT id, claimed_at FROM runs
                    WHERE status = 'running' AND attempt = 1 AND resumable
                      AND kind IN ('agent', 'workflow')
                      AND id <> ALL(ARRAY(SELECT id FROM picked))
                      AND (yield_for IS NULL OR NOT EXISTS (
                          SELECT 1 FROM runs q WHERE q.id = runs.yield_for
                            AND q.status = 'queued'))
                    ORDER BY claimed_at DESC
                    LIMIT :asks
                    FOR UPDATE SKIP LOCKED) v),
            asked AS (
                UPDATE runs SET yield_for = lost.id
                FROM lost JOIN yielders USING (n)
                WHERE runs.id = yielders.id
                RETURNING runs.id AS yielder, lost.id AS lost_id)"""

# A mass loss needs no more yields than a handful of slots can give at once: one claim statement
# locks at most this many running runs to ask (each lost run queued beyond them simply waits, at
# the head of the queue, for the next slot that frees). Unbounded, a sweep claiming 1,000 runs
# found, locked and marked up to 2,000 others, and took seconds instead of milliseconds.
ASKS_PER_CLAIM = 16

# No asks: the audit's join finds none.
_NO_ASKS = """,
            asked AS (SELECT NULL::uuid AS yielder, NULL::uuid AS lost_id WHERE false)"""


def claim_lost(
    conn: sa.Connection,
    run_id: str,
    attempt: int,
    loss_limit: int,
    seen: Seen = Seen.LEASE_LAPSED,
    *,
    ask_yields: bool = False,
    notes: Sequence[Note] = (),
) -> ClaimResult | None:
    """Claim one run whose lease lapsed (see `claim_lost_many`); None if another claim won."""
    claims = claim_lost_many(
        conn, [(run_id, attempt)], loss_limit, seen, ask_yields=ask_yields, notes=notes
    )
    return claims[0] if claims else None


def claim_lost_many(
    conn: sa.Connection,
    lapsed: list[tuple[str, int]],
    loss_limit: int,
    seen: Seen = Seen.LEASE_LAPSED,
    *,
    ask_yields: bool = False,
    notes: Sequence[Note] = (),
) -> list[ClaimResult]:
    """Claim runs whose leases lapsed, each exactly once per loss (I4), in one statement: each
    row matches only at the lapsed attempt while running or answered, so of two sweeps one wins
    each run. The attempt and loss count go up, and the run is queued again, or failed with the
    reason when lost more than the limit (or not written ahead). An answered run is requeued to
    hand its answer on, and failed too once its hand-on was lost more than the limit. Each
    loss, and a failure's notice on the transcript
    and entry points, are written by the same statement; the loss's audit says how the death
    was seen (`seen`: lease_lapsed, lease_missing, connection_closed, pool_child_died, or
    parent_asked_again: a resumed parent asking its child again by key found its lease gone).
    `ask_yields` (resumed runs first): each run queued again asks one running first attempt to
    yield its slot to it (`_ASK_YIELDS`), named in its loss's audit (`asked_to_yield`).
    `notes`: what the lost attempts reserved for the steps they asked, recorded as unconfirmed
    usage by this statement for steps they never wrote (store/ledger.py)."""
    if not lapsed:
        return []
    # Rows are locked one by one, by primary key, in one order for every claimer (a sweep and
    # the death watch claiming overlapping batches never deadlock), before the update. Joining
    # the batch in the UPDATE itself let the planner pick a nested loop over the whole batch
    # once the table's statistics changed: a sweep of 1,000 lapsed runs at 100k running took
    # seconds instead of milliseconds.
    lapsed = sorted(lapsed)
    rows = conn.execute(
        sql(
            f"""
            WITH picked AS MATERIALIZED (
                SELECT r.id, r.yield_for AS asked_for
                FROM unnest(CAST(:ids AS uuid[]), CAST(:attempts AS int[]))
                    AS l(lapsed_id, lapsed_attempt)
                CROSS JOIN LATERAL (
                    SELECT id, yield_for FROM runs
                    WHERE id = l.lapsed_id AND attempt = l.lapsed_attempt
                      AND status IN ('running', 'answered')
                    FOR UPDATE) AS r),
            c AS (
                UPDATE runs SET
                    attempt = runs.attempt + 1,
                    lost_count = lost_count + 1,
                    deliveries = 0,
                    resume_reason = 'lost',
                    yield_for = NULL,
                    queued_at = now(),
                    updated_at = now(),
                    status = CASE
                        WHEN lost_count + 1 > :limit THEN 'failed'
                        WHEN status = 'answered' THEN 'answered'
                        WHEN NOT resumable THEN 'failed'
                        ELSE 'queued' END,
                    failure_reason = CASE
                        WHEN status = 'answered' AND lost_count + 1 > :limit
                        THEN 'its answer could not be handed on: lost ' || (lost_count + 1)
                             || ' times (limit ' || :limit || '); the answer is kept sealed '
                             || 'on the run; check the entry point and the workers'' logs'
                        WHEN status = 'answered' THEN failure_reason
                        WHEN NOT resumable
                        THEN 'interrupted: its worker died and it was not written ahead, so it '
                             || 'cannot resume; start it again'
                        WHEN lost_count + 1 > :limit
                        THEN 'lost ' || (lost_count + 1) || ' times (limit ' || :limit
                             || '): its worker died each time; start it again once the cause '
                             || 'is fixed'
                        ELSE failure_reason END,
                    finished_at = CASE
                        WHEN lost_count + 1 > :limit
                          OR (status <> 'answered' AND NOT resumable)
                        THEN now() ELSE finished_at END
                WHERE runs.id = ANY(ARRAY(SELECT id FROM picked))
                  AND status IN ('running', 'answered')
                RETURNING runs.id, runs.attempt, status, lost_count, step, failure_reason,
                          resumable, claimed_by, claimed_at, answer IS NOT NULL AS answered)
            {_ASK_YIELDS if ask_yields else _NO_ASKS},
            a AS (
                INSERT INTO audit_events (run_id, kind, attempt, step, detail)
                SELECT c.id, CASE WHEN status = 'failed' THEN 'agent.run.failed'
                                ELSE 'agent.run.lost' END,
                       attempt, step,
                       jsonb_build_object('lost_count', lost_count, 'lost_attempt', attempt - 1,
                                          'asked_to_yield', asked.yielder,
                                          'reason', failure_reason, 'resumable', resumable,
                                          'lost_holder', claimed_by, 'seen', CAST(:seen AS text),
                                          'lost_claimed_at', claimed_at,
                                          'answered', answered,
                                          'code', CASE WHEN status <> 'failed' THEN NULL
                                                       WHEN answered THEN 'hand_on_lost'
                                                       WHEN NOT resumable THEN 'interrupted'
                                                       ELSE 'loss_limit' END)
                FROM c LEFT JOIN asked ON asked.lost_id = c.id),{unconfirmed_cte("c")}
            {_CLAIMED_TAIL}
            """
        ),
        {
            "ids": [r for r, _ in lapsed],
            "attempts": [a for _, a in lapsed],
            "limit": loss_limit,
            "seen": seen,
            "asks": min(2 * len(lapsed), ASKS_PER_CLAIM),
            **note_params(notes),
        },
    ).all()
    return _claim_results(rows)


def claim_store_faulted_many(
    conn: sa.Connection,
    faulted: list[tuple[str, int]],
    present: list[str],
    notes: Sequence[Note] = (),
) -> list[ClaimResult]:
    """Claim runs that lost their lease to a store fault (Redis lost it) while their holder's
    process lives (its holder is in `present`, connected to Redis now): each exactly once (I4),
    in one statement, matching only at that attempt while running or answered and still
    claimed by a present holder. The attempt goes up and the run is queued again (an answered
    one stays answered to hand its answer on), with no loss charged: `lost_count` is left as
    it is, so a store blip never counts toward the loss limit; the resume is audited as
    `agent.run.store_fault` (detail reason `store_fault`). A run not written ahead cannot
    resume and is failed with the reason. Runs whose holder is gone are `claim_lost_many`'s.
    `notes`: as `claim_lost_many`'s (the faulted attempt's step asked is unconfirmed too)."""
    if not faulted or not present:
        return []
    faulted = sorted(faulted)  # one lock order for every claimer (see claim_lost_many)
    rows = conn.execute(
        sql(
            f"""
            WITH picked AS MATERIALIZED (
                SELECT r.id FROM unnest(CAST(:ids AS uuid[]), CAST(:attempts AS int[]))
                    AS l(faulted_id, faulted_attempt)
                CROSS JOIN LATERAL (
                    SELECT id FROM runs
                    WHERE id = l.faulted_id AND attempt = l.faulted_attempt
                      AND status IN ('running', 'answered')
                      AND claimed_by = ANY(CAST(:present AS text[]))
                    FOR UPDATE) AS r),
            c AS (
                UPDATE runs SET
                    attempt = runs.attempt + 1,
                    deliveries = 0,
                    resume_reason = 'store_fault',
                    queued_at = now(),
                    updated_at = now(),
                    status = CASE
                        WHEN status = 'answered' THEN 'answered'
                        WHEN NOT resumable THEN 'failed'
                        ELSE 'queued' END,
                    failure_reason = CASE
                        WHEN status <> 'answered' AND NOT resumable
                        THEN 'interrupted: Redis lost its lease while it ran and it was not '
                             || 'written ahead, so it cannot resume; start it again'
                        ELSE failure_reason END,
                    finished_at = CASE
                        WHEN status <> 'answered' AND NOT resumable THEN now()
                        ELSE finished_at END
                WHERE runs.id = ANY(ARRAY(SELECT id FROM picked))
                  AND status IN ('running', 'answered')
                RETURNING runs.id, runs.attempt, status, lost_count, step, failure_reason,
                          resumable, claimed_by, claimed_at, answer IS NOT NULL AS answered),
            a AS (
                INSERT INTO audit_events (run_id, kind, attempt, step, detail)
                SELECT id, CASE WHEN status = 'failed' THEN 'agent.run.failed'
                                ELSE 'agent.run.store_fault' END,
                       attempt, step,
                       jsonb_build_object('reason', 'store_fault', 'lost_count', lost_count,
                                          'faulted_attempt', attempt - 1,
                                          'holder', claimed_by, 'seen', 'lease_missing',
                                          'faulted_claimed_at', claimed_at,
                                          'answered', answered,
                                          'failure', failure_reason,
                                          'code', CASE WHEN status = 'failed'
                                                       THEN 'interrupted' END)
                FROM c),{unconfirmed_cte("c")}
            {_CLAIMED_TAIL}
            """
        ),
        {
            "ids": [r for r, _ in faulted],
            "attempts": [a for _, a in faulted],
            "present": present,
            **note_params(notes),
        },
    ).all()
    return _claim_results(rows)


def loss_seen(conn: sa.Connection, run_id: str, attempt: int) -> Seen | None:
    """How the loss that made `attempt` was seen (`Seen`, from its claim's audit), or None
    when no loss made it."""
    row = conn.execute(
        sql(
            """
            SELECT detail ->> 'seen' AS seen FROM audit_events
            WHERE run_id = :run_id AND kind = 'agent.run.lost' AND attempt = :attempt
            ORDER BY id DESC LIMIT 1
            """
        ),
        {"run_id": run_id, "attempt": attempt},
    ).first()
    if row is None or row.seen not in set(Seen):
        return None  # no loss made it, or its audit names no way we know
    return Seen(row.seen)
