"""Append-only records: audit events and transcript lines."""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa

from store.db import sql, to_json
from store.rows import AuditRow, TranscriptRow
from store.runs import RESUMING_OWNER_CTE


def insert_audit(
    conn: sa.Connection,
    *,
    kind: str,
    run_id: str | None = None,
    attempt: int | None = None,
    step: int | None = None,
    detail: dict[str, Any] | None = None,
) -> None:
    conn.execute(
        sql(
            "INSERT INTO audit_events (run_id, kind, attempt, step, detail) "
            "VALUES (:run_id, :kind, :attempt, :step, CAST(:detail AS jsonb))"
        ),
        {
            "run_id": run_id,
            "kind": kind,
            "attempt": attempt,
            "step": step,
            "detail": to_json(detail or {}),
        },
    )


def insert_audit_once(
    conn: sa.Connection, *, run_id: str, kind: str, detail: dict[str, Any]
) -> None:
    """An audit event of this kind for this run, unless one is already there (a finding that
    every read would repeat, such as an answer that does not verify)."""
    conn.execute(
        sql(
            "INSERT INTO audit_events (run_id, kind, detail) "
            "SELECT :run_id, :kind, CAST(:detail AS jsonb) WHERE NOT EXISTS "
            "(SELECT 1 FROM audit_events WHERE run_id = :run_id AND kind = :kind)"
        ),
        {"run_id": run_id, "kind": kind, "detail": to_json(detail)},
    )


def insert_owned_audit(
    conn: sa.Connection,
    *,
    run_id: str,
    attempt: int,
    kind: str,
    step: int,
    detail: dict[str, Any],
) -> bool:
    """An audit event written only while this attempt owns the run, running or handing on
    its stored answer (I3); False if fenced."""
    row = conn.execute(
        sql(
            f"""
            WITH {RESUMING_OWNER_CTE}
            INSERT INTO audit_events (run_id, kind, attempt, step, detail)
            SELECT id, :kind, :attempt, :step, CAST(:detail AS jsonb) FROM owner
            RETURNING id
            """
        ),
        {
            "run_id": run_id,
            "attempt": attempt,
            "kind": kind,
            "step": step,
            "detail": to_json(detail),
        },
    ).first()
    return row is not None


def select_audit(conn: sa.Connection, run_id: str, kind: str | None = None) -> list[AuditRow]:
    where = "run_id = :id" + ("" if kind is None else " AND kind = :kind")
    rows = conn.execute(
        sql(
            "SELECT id, run_id, kind, attempt, step, detail, created_at FROM audit_events "
            f"WHERE {where} ORDER BY id"
        ),
        {"id": run_id, "kind": kind},
    ).all()
    return [AuditRow(**r._mapping) for r in rows]


def select_transcript(conn: sa.Connection, run_id: str) -> list[TranscriptRow]:
    """The run's transcript: its input (kept on the run, so starting a run writes one row),
    then every line written since, in order."""
    rows = conn.execute(
        sql(
            "SELECT 0 AS id, id AS run_id, 'user' AS role, input AS content, created_at "
            "FROM runs WHERE id = :id AND input <> '' "
            "UNION ALL SELECT id, run_id, role, content, created_at FROM transcript_messages "
            "WHERE run_id = :id ORDER BY id"
        ),
        {"id": run_id},
    ).all()
    return [TranscriptRow(**r._mapping) for r in rows]
