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


# What an erased run's definition keeps: the tools it was allowed and which model provider and
# model it used, never the script, system prompt, entry details, job parameters or workflow
# arguments it was given.
_SPEC_KEPT = """jsonb_build_object(
    'erased', true, 'tools', spec -> 'tools',
    'model', jsonb_build_object('provider', spec -> 'model' -> 'provider',
                                'model', spec -> 'model' -> 'model'))"""


def erase_content(conn: sa.Connection, run_ids: list[str], *, by: str) -> list[tuple[str, str]]:
    """Delete the content of finished runs in one statement: checkpoint, answer, input, the
    definition's content (`_SPEC_KEPT`), transcript, the call marks' outcomes (what the tools
    answered) and the model's ids for the calls, approvals' call arguments and reasons (a
    pending one, a call nobody decided, goes whole), the A2A task's message and answer, the
    cron outcome, the Teams turn's text, activity and reply. What stays: the run's row
    (status, times, agent, owner, failure reason), its marks and decided approvals without
    their content (which tool, of what kind, how it was settled, who decided: the run's events
    are derived from them, and deleting them would renumber the events a follower already
    has), the entry rows' ids (a message sent again is still the same, erased, task) and the
    audit, with one `agent.run.erased` row per run naming who erased it. Returns (run id,
    status) of each run erased."""
    rows = conn.execute(
        sql(
            f"""
            WITH e AS (
                UPDATE runs SET checkpoint = NULL, answer = NULL, input = '',
                       spec = {_SPEC_KEPT},
                       answer_purged_at = coalesce(answer_purged_at, now()),
                       updated_at = now()
                WHERE id = ANY(CAST(:ids AS uuid[])) AND status IN ('succeeded', 'failed')
                RETURNING id, attempt, step, status),
            marks AS (
                UPDATE call_marks SET outcome = NULL, call_id = ''
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
            turn AS (
                UPDATE teams_inbox SET text = '', activity = NULL, reply = NULL
                WHERE run_id IN (SELECT id FROM e)),
            a AS (
                INSERT INTO audit_events (run_id, kind, attempt, step, detail)
                SELECT id, 'agent.run.erased', attempt, step,
                       jsonb_build_object('by', CAST(:by AS text), 'status', status)
                FROM e)
            SELECT id, status FROM e ORDER BY id
            """
        ),
        {"ids": run_ids, "by": by},
    ).all()
    return [(r.id, r.status) for r in rows]
