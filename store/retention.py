"""Retention statements: delete finished runs past their keep, and old audit rows, one bounded
batch per statement, oldest first.

Each batch locks the rows it takes with `FOR UPDATE SKIP LOCKED`, so two beats (or two passes)
running at once take disjoint batches and never wait on each other or on a live write.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

import sqlalchemy as sa

from store.db import sql
from store.schema import metadata


@dataclass(frozen=True)
class Batch:
    """What one retention statement deleted: how many rows, and the oldest and newest time
    (finish time of runs, write time of audit rows) among them."""

    deleted: int
    oldest: datetime | None
    newest: datetime | None


# A finished run whose keep is over, that no guarantee still needs: it is finished (succeeded
# or failed; an answered run has an answer not yet handed on), a succeeded run's sealed answer is
# past its own keep, a key a caller may send again (its request key, or the message id, activity
# id or cron slot of its entry point) no longer dedupes, and its parent is not still running
# (a resuming parent reads its child's end). Every keep is the setting in force, counted from the
# run's finish: lowering one applies to runs finished before (the answer's keep was once an expiry
# stamped at finish, `answer_expires_at`, which a lowered setting never reached; issue 31).
_EXPIRED_WHERE = """
    r.status IN ('succeeded', 'failed')
      AND r.finished_at < now() - make_interval(secs => :keep_s)
      AND (r.status = 'failed'
           OR r.finished_at < now() - make_interval(secs => :answer_keep_s))
      AND ((r.request_key IS NULL AND r.entry_kind = 'plain')
           OR r.finished_at < now() - make_interval(secs => :key_window_s))
      AND NOT EXISTS (
          SELECT 1 FROM runs p
          WHERE p.id = r.parent_run_id AND p.status NOT IN ('succeeded', 'failed'))"""

_EXPIRED_RUNS = f"""
    SELECT r.id, r.finished_at FROM runs r
    WHERE {_EXPIRED_WHERE}
    ORDER BY r.finished_at, r.id
    LIMIT :batch
    FOR UPDATE OF r SKIP LOCKED"""

# An audit row past its keep whose run is gone (or that names no run); `gone` is how the run's
# absence is said (a pass deletes runs first, so a dry run counts the runs it would delete too).
_EXPIRED_AUDIT_WHERE = """
    a.created_at < now() - make_interval(secs => :audit_keep_s)
      AND (a.run_id IS NULL OR NOT EXISTS (SELECT 1 FROM runs r WHERE r.id = a.run_id){gone})"""

# The tables whose rows go with their run: every table naming a run but the audit, which
# outlives it (by foreign key cascade, or deleted with it: Teams inbox rows and stops).
WITH_RUN = tuple(
    sorted(t.name for t in metadata.tables.values() if "run_id" in t.c and t.name != "audit_events")
)


@dataclass(frozen=True)
class Keeps:
    """How long finished runs and audit rows are kept, in seconds: the settings in force."""

    keep_s: int
    key_window_s: int
    answer_keep_s: int
    audit_keep_s: int


def delete_expired_runs(conn: sa.Connection, keeps: Keeps, *, batch: int) -> Batch:
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
        {**_run_keeps(keeps), "batch": batch},
    ).one()
    return Batch(int(row.n), row.oldest, row.newest)


def delete_expired_audit(conn: sa.Connection, *, keep_s: int, batch: int) -> Batch:
    """Delete at most `batch` audit rows older than `keep_s` whose run is gone (or that name no
    run), oldest first, in one statement: a run's audit lives as long as the run, and at least
    `keep_s`."""
    where = _EXPIRED_AUDIT_WHERE.format(gone="")
    return _delete_oldest(conn, "audit_events", where, {"audit_keep_s": keep_s}, batch)


def delete_expired_events(conn: sa.Connection, *, keep_s: int, batch: int) -> Batch:
    """Delete at most `batch` published events older than `keep_s`, oldest first, in one
    statement: a wait that took one recorded it with its run, and a publisher's key dedupes
    only while its event is kept (store/workflow_events.py)."""
    where = "a.created_at < now() - make_interval(secs => :keep_s)"
    return _delete_oldest(conn, "workflow_events", where, {"keep_s": keep_s}, batch)


def _delete_oldest(
    conn: sa.Connection, table: str, where: str, params: dict[str, Any], batch: int
) -> Batch:
    """Delete at most `batch` rows of `table` (aliased `a` in `where`) oldest first, skipping
    rows another pass holds, in one statement."""
    row = conn.execute(
        sql(
            f"""
            WITH victims AS (
                SELECT a.id FROM {table} a WHERE {where}
                ORDER BY a.created_at, a.id
                LIMIT :batch
                FOR UPDATE OF a SKIP LOCKED),
            gone AS (
                DELETE FROM {table} WHERE id IN (SELECT id FROM victims)
                RETURNING created_at)
            SELECT count(*) AS n, min(created_at) AS oldest, max(created_at) AS newest
            FROM gone
            """
        ),
        {**params, "batch": batch},
    ).one()
    return Batch(int(row.n), row.oldest, row.newest)


@dataclass(frozen=True)
class Expired:
    """What a retention pass under given keeps would delete now: rows by table (`runs`, each
    table in WITH_RUN, `audit_events`), and the oldest and newest finish among the runs."""

    rows: dict[str, int]
    oldest: datetime | None
    newest: datetime | None


def count_expired(conn: sa.Connection, keeps: Keeps) -> Expired:
    """Count, without deleting or locking anything, what `delete_expired_runs` and then
    `delete_expired_audit` would delete under `keeps` if run until nothing was left (one
    statement: one snapshot)."""
    tables = ",\n".join(
        f"(SELECT count(*) FROM {t} WHERE run_id IN (SELECT id FROM victims)) AS {t}"
        for t in WITH_RUN
    )
    gone = " OR a.run_id IN (SELECT id FROM victims)"
    row = conn.execute(
        sql(
            f"""
            WITH victims AS (SELECT r.id, r.finished_at FROM runs r WHERE {_EXPIRED_WHERE})
            SELECT (SELECT count(*) FROM victims) AS runs,
                   {tables},
                   (SELECT count(*) FROM audit_events a
                    WHERE {_EXPIRED_AUDIT_WHERE.format(gone=gone)}) AS audit_events,
                   (SELECT min(finished_at) FROM victims) AS oldest,
                   (SELECT max(finished_at) FROM victims) AS newest
            """
        ),
        {**_run_keeps(keeps), "audit_keep_s": keeps.audit_keep_s},
    ).one()
    counts = row._mapping
    names = ("runs", *WITH_RUN, "audit_events")
    return Expired({n: int(counts[n]) for n in names}, row.oldest, row.newest)


def _run_keeps(keeps: Keeps) -> dict[str, int]:
    return {
        "keep_s": keeps.keep_s,
        "key_window_s": keeps.key_window_s,
        "answer_keep_s": keeps.answer_keep_s,
    }
