"""Erasure statements: fence a run's attempt out, then delete its content, leaving a tombstone
(the run's row with its status, and an `agent.run.erased` audit row naming who erased it).

Call them in one transaction (READ COMMITTED), in order: `lock_erasable` first, whose row locks
hold off every fenced write of the runs until the transaction commits; the statements after it
each see what such a write committed before the lock was taken.
"""

from __future__ import annotations

from dataclasses import dataclass

import sqlalchemy as sa

from store.db import sql
from store.entries import ends_cte


@dataclass(frozen=True)
class Erasable:
    """A run erasure takes: its id and its status when it was locked."""

    id: str
    status: str


def lock_erasable(
    conn: sa.Connection, *, run_id: str | None = None, owner: str | None = None
) -> list[Erasable]:
    """The run (or every run of the owner) and the sub-agent runs below them, each row locked
    `FOR UPDATE` in id order (two erasures never deadlock). While the lock is held no fenced
    write of any attempt of these runs can land (each needs the row, I3)."""
    if (run_id is None) == (owner is None):
        raise ValueError("erase exactly one run or one owner's runs")
    rows = conn.execute(
        sql(
            """
            WITH RECURSIVE tree AS (
                SELECT id FROM runs
                WHERE id = CAST(:run_id AS uuid) OR owner = CAST(:owner AS text)
                UNION
                SELECT r.id FROM runs r JOIN tree ON r.parent_run_id = tree.id)
            SELECT id, status FROM runs WHERE id IN (SELECT id FROM tree)
            ORDER BY id
            FOR UPDATE
            """
        ),
        {"run_id": run_id, "owner": owner},
    ).all()
    return [Erasable(r.id, r.status) for r in rows]


def fence_out(conn: sa.Connection, run_ids: list[str], *, by: str) -> list[str]:
    """Fail every run of `run_ids` that is still running or holds an answer not handed on, and
    bump its attempt, in one statement: the attempt in flight is taken over, so each write it
    tries next matches nothing (I3), as after a sweeper's claim. Its entry points are told,
    and each failure audited with code `erased`. Returns the runs failed here."""
    rows = conn.execute(
        sql(
            f"""
            WITH f AS (
                UPDATE runs SET status = 'failed', attempt = attempt + 1, waiting_on = NULL,
                       failure_reason = 'erased by ' || :by, finished_at = now(),
                       updated_at = now()
                WHERE id = ANY(CAST(:ids AS uuid[])) AND status IN ('running', 'answered')
                RETURNING id, attempt, step, failure_reason),
            a AS (
                INSERT INTO audit_events (run_id, kind, attempt, step, detail)
                SELECT id, 'agent.run.failed', attempt, step,
                       jsonb_build_object('code', 'erased', 'by', CAST(:by AS text),
                                          'reason', failure_reason)
                FROM f)
            {ends_cte("f", success=False, outcome_sql="f.failure_reason")}
            SELECT id FROM f
            """
        ),
        {"ids": run_ids, "by": by},
    ).all()
    return [r.id for r in rows]


# What of an erased run's audit rows stays: ids, codes, counts, times and names of ours (which
# tool, of what kind, how it was settled, who decided or erased), never free text (a failure's
# or an approver's reason, a provider's message) or the model's ids for the calls. A `reason`
# stays only when it is a code (`store_fault`, `lost`); each call of a resume keeps its tool,
# kind and settlement.
AUDIT_KEPT = (
    "answered",
    "agent",
    "approval_id",
    "by",
    "call_index",
    "claimed_at",
    "code",
    "column_name",
    "constraint_name",
    "db_error",
    "error",
    "faulted_attempt",
    "faulted_claimed_at",
    "holder",
    "kind",
    "lost_attempt",
    "lost_claimed_at",
    "lost_count",
    "lost_holder",
    "resumable",
    "resumed_from",
    "seen",
    "settlement",
    "sqlstate",
    "status",
    "step",
    "stop_id",
    "stopped_by",
    "table_name",
    "tool",
    "waiting_on",
    "where",
    "worker",
)
_AUDIT_ERASED = """(
    SELECT coalesce(jsonb_object_agg(k, v), '{}'::jsonb) FROM jsonb_each(detail) AS x(k, v)
    WHERE k = ANY(CAST(:kept AS text[]))
       OR (k = 'reason' AND jsonb_typeof(v) = 'string' AND v #>> '{}' ~ '^[a-z_]{1,40}$')
) || CASE WHEN jsonb_typeof(detail -> 'calls') = 'array' THEN jsonb_build_object('calls', (
    SELECT coalesce(jsonb_agg(c - 'call_id'), '[]'::jsonb)
    FROM jsonb_array_elements(detail -> 'calls') AS c)) ELSE '{}'::jsonb END"""
# An erased run's failure reason: its failure's code only (the reason's text may quote a
# provider, a tool or the user), unless this erasure failed it (its own words are kept).
_REASON_ERASED = """CASE WHEN failure_reason IS NULL THEN NULL
    WHEN failure_reason IN ('erased by ' || :by, 'stopped by ' || :by || ': erasure')
        THEN failure_reason
    ELSE coalesce(
    'failed: ' || (SELECT detail ->> 'code' FROM audit_events ae
                   WHERE ae.run_id = runs.id AND ae.kind = 'agent.run.failed'
                     AND ae.detail ->> 'code' IS NOT NULL
                   ORDER BY ae.id DESC LIMIT 1),
    'failed') || '; its reason was erased' END"""
# A request digest says nothing of the input once erased: a key that named the run still
# refuses any other request (store/runs.py `insert_run`), and a guess can no longer be tested.
ERASED_DIGEST = "erased"


def erase_content(conn: sa.Connection, run_ids: list[str], *, by: str) -> list[tuple[str, str]]:
    """Delete the content of finished runs in one statement: checkpoint, step records' sealed
    content, answer, input, sealed definition, the failure reason's text (its code stays), the
    request digest, transcript, the call marks' outcomes (what the tools answered) and the
    model's ids for the calls, approvals' call arguments and reasons (a pending one, a call
    nobody decided, goes whole), the free text of its audit rows (`AUDIT_KEPT`), the A2A
    task's message and answer, the signals' payloads, the cron outcome, the Teams turn's
    text, activity and reply.
    What stays: the run's row (status, times, agent, owner, failure code), its step records,
    marks and decided approvals without their content (which step, which tool, of what kind,
    how it was settled, who decided: the run's events are derived from them, and deleting them
    would renumber the events a follower already has), the entry rows' ids (a message sent
    again is still the same, erased, task) and the audit without free text, with one
    `agent.run.erased` row per run naming who erased it. Returns (run id, status) of each run
    erased."""
    rows = conn.execute(
        sql(
            f"""
            WITH e AS (
                UPDATE runs SET checkpoint = NULL, answer = NULL, input = '',
                       definition = NULL, pin = NULL, failure_reason = {_REASON_ERASED},
                       request_digest = CASE WHEN request_digest IS NULL THEN NULL
                                             ELSE :erased_digest END,
                       answer_purged_at = coalesce(answer_purged_at, now()),
                       updated_at = now()
                WHERE id = ANY(CAST(:ids AS uuid[])) AND status IN ('succeeded', 'failed')
                RETURNING id, attempt, step, status),
            steps AS (
                UPDATE run_steps SET sealed = ''::bytea WHERE run_id IN (SELECT id FROM e)),
            marks AS (
                UPDATE call_marks SET outcome = NULL, call_id = ''
                WHERE run_id IN (SELECT id FROM e)),
            said AS (
                UPDATE audit_events SET detail = {_AUDIT_ERASED}
                WHERE run_id IN (SELECT id FROM e)),
            lines AS (DELETE FROM transcript_messages WHERE run_id IN (SELECT id FROM e)),
            held AS (
                DELETE FROM approvals
                WHERE run_id IN (SELECT id FROM e) AND status = 'pending'),
            decided AS (
                UPDATE approvals SET args = '{{}}'::jsonb, reason = NULL
                WHERE run_id IN (SELECT id FROM e) AND status <> 'pending'),
            task AS (
                UPDATE a2a_tasks SET message = NULL, answer = NULL, updated_at = now()
                WHERE run_id IN (SELECT id FROM e)),
            cron AS (UPDATE cron_runs SET outcome = NULL WHERE run_id IN (SELECT id FROM e)),
            sent AS (UPDATE signals SET payload = NULL WHERE run_id IN (SELECT id FROM e)),
            turn AS (
                UPDATE teams_inbox SET text = '', activity = NULL, reply = NULL
                WHERE run_id IN (SELECT id FROM e)),
            halted AS (
                UPDATE stops SET reason = 'erased'
                WHERE run_id IN (SELECT id FROM e) AND reason <> 'erasure'),
            a AS (
                INSERT INTO audit_events (run_id, kind, attempt, step, detail)
                SELECT id, 'agent.run.erased', attempt, step,
                       jsonb_build_object('by', CAST(:by AS text), 'status', status)
                FROM e)
            SELECT id, status FROM e ORDER BY id
            """
        ),
        {"ids": run_ids, "by": by, "kept": list(AUDIT_KEPT), "erased_digest": ERASED_DIGEST},
    ).all()
    return [(r.id, r.status) for r in rows]


def erase_unstarted_turns(conn: sa.Connection, sender_id: str) -> int:
    """Empty the Teams turns of this sender that never started a run (a turn refused at
    intake, or one failed by an upgrade): their text and activity are the person's content as
    much as a run's. Returns how many."""
    rows = conn.execute(
        sql(
            """
            UPDATE teams_inbox SET text = '', activity = NULL, reply = NULL
            WHERE sender_id = :sender AND run_id IS NULL
              AND (text <> '' OR activity IS NOT NULL OR reply IS NOT NULL)
            RETURNING id
            """
        ),
        {"sender": sender_id},
    ).all()
    return len(rows)
