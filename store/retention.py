"""Retention statements: delete finished runs past their keep, and old audit rows, one bounded
batch per statement, oldest first.

Each batch locks the rows it takes with `FOR UPDATE SKIP LOCKED`, so two beats (or two passes)
running at once take disjoint batches and never wait on each other or on a live write.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

import sqlalchemy as sa

from store.db import sql


@dataclass(frozen=True)
class Batch:
    """What one retention statement deleted: how many rows, and the oldest and newest time
    (finish time of runs, write time of audit rows) among them."""

    deleted: int
    oldest: datetime | None
    newest: datetime | None


# A finished run whose keep is over, that no guarantee still needs: it is finished (succeeded
# or failed; an answered run has an answer not yet handed on), its sealed answer's own
# retention is over, a key a caller may send again (its request key, or the message id, activity
# id or cron slot of its entry point) no longer dedupes, and its parent is not still running
# (a resuming parent reads its child's end).
_EXPIRED_RUNS = """
    SELECT r.id, r.finished_at FROM runs r
    WHERE r.status IN ('succeeded', 'failed')
      AND r.finished_at < now() - make_interval(secs => :keep_s)
      AND (r.answer_expires_at IS NULL OR r.answer_expires_at < now())
      AND ((r.request_key IS NULL AND r.entry_kind = 'plain')
           OR r.finished_at < now() - make_interval(secs => :key_window_s))
      AND NOT EXISTS (
          SELECT 1 FROM runs p
          WHERE p.id = r.parent_run_id AND p.status NOT IN ('succeeded', 'failed'))
    ORDER BY r.finished_at, r.id
    LIMIT :batch
    FOR UPDATE OF r SKIP LOCKED"""


def delete_expired_runs(
    conn: sa.Connection, *, keep_s: int, key_window_s: int, batch: int
) -> Batch:
    """Delete at most `batch` finished runs past their keep, oldest finish first, with what
    hangs on them, in one statement. Call marks, transcript lines, approvals, the A2A task and
    the cron record go by their foreign keys (ON DELETE CASCADE); Teams inbox rows and stops,
    which name the run without one, are deleted here. Audit rows stay (see
    `delete_expired_audit`). A run a concurrent pass locked is skipped, not waited for."""
    row = conn.execute(
        sql(
            f"""
            WITH victims AS ({_EXPIRED_RUNS}),
            teams AS (DELETE FROM teams_inbox WHERE run_id IN (SELECT id FROM victims)),
            stops AS (DELETE FROM stops WHERE run_id IN (SELECT id FROM victims)),
            gone AS (
                DELETE FROM runs WHERE id IN (SELECT id FROM victims)
                RETURNING finished_at)
            SELECT count(*) AS n, min(finished_at) AS oldest, max(finished_at) AS newest
            FROM gone
            """
        ),
        {"keep_s": keep_s, "key_window_s": key_window_s, "batch": batch},
    ).one()
    return Batch(int(row.n), row.oldest, row.newest)


def delete_expired_audit(conn: sa.Connection, *, keep_s: int, batch: int) -> Batch:
    """Delete at most `batch` audit rows older than `keep_s` whose run is gone (or that name no
    run), oldest first, in one statement: a run's audit lives as long as the run, and at least
    `keep_s`."""
    row = conn.execute(
        sql(
            """
            WITH victims AS (
                SELECT a.id FROM audit_events a
                WHERE a.created_at < now() - make_interval(secs => :keep_s)
                  AND (a.run_id IS NULL
                       OR NOT EXISTS (SELECT 1 FROM runs r WHERE r.id = a.run_id))
                ORDER BY a.created_at, a.id
                LIMIT :batch
                FOR UPDATE OF a SKIP LOCKED),
            gone AS (
                DELETE FROM audit_events WHERE id IN (SELECT id FROM victims)
                RETURNING created_at)
            SELECT count(*) AS n, min(created_at) AS oldest, max(created_at) AS newest
            FROM gone
            """
        ),
        {"keep_s": keep_s, "batch": batch},
    ).one()
    return Batch(int(row.n), row.oldest, row.newest)
