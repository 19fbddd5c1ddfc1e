"""Entry points in SQL: linking a new run to where it came from, and landing its end there.

The fragments here are CTEs that ride in the run's own statements, so a run's answer or failure
reaches its A2A task, cron record and Teams inbox row exactly when the run ends, and once.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import sqlalchemy as sa

from store.rows import FencedOut


@dataclass(frozen=True)
class EntryLink:
    """What a new run is linked to: an A2A task id, a cron trigger and slot, an inbox row."""

    kind: str  # a2a | cron | teams
    ref: str
    scheduled_at: datetime | None = None

    def cte(self) -> tuple[str, dict[str, Any]]:
        """A CTE inserting the link for the run the `r` CTE inserted."""
        if self.kind == "a2a":
            return (
                "link AS (INSERT INTO a2a_tasks (id, run_id) SELECT :link_ref, id FROM r)",
                {"link_ref": self.ref},
            )
        if self.kind == "cron":
            return (
                "link AS (INSERT INTO cron_runs (trigger, scheduled_at, run_id) "
                "SELECT :link_ref, :link_at, id FROM r)",
                {"link_ref": self.ref, "link_at": self.scheduled_at},
            )
        if self.kind == "teams":
            return (
                "link AS (UPDATE teams_inbox SET status = 'running', run_id = r.id FROM r "
                "WHERE teams_inbox.id = CAST(:link_ref AS bigint))",
                {"link_ref": self.ref},
            )
        raise ValueError(f"unknown entry link {self.kind!r}")


def ends_cte(source: str, *, success: bool, outcome_sql: str, where: str = "TRUE") -> str:
    """CTEs (to append after `source`) landing the run's end on its entry points."""
    a2a, cron, teams = (
        ("completed", "succeeded", "replied") if success else ("failed", "failed", "failed")
    )
    reply = ", reply = CAST(:reply AS jsonb), replied_at = now()" if success else ""
    return f""",
    e_a2a AS (
        UPDATE a2a_tasks SET status = '{a2a}', answer = {outcome_sql}, updated_at = now()
        FROM {source} WHERE a2a_tasks.run_id = {source}.id AND {where}),
    e_cron AS (
        UPDATE cron_runs SET status = '{cron}', outcome = {outcome_sql}, recorded_at = now()
        FROM {source} WHERE cron_runs.run_id = {source}.id AND cron_runs.recorded_at IS NULL
          AND {where}),
    e_teams AS (
        UPDATE teams_inbox SET status = '{teams}'{reply}
        FROM {source} WHERE teams_inbox.run_id = {source}.id AND {where})"""


def deliver(
    conn: sa.Connection,
    run_id: str,
    attempt: int,
    text: str,
    *,
    retention_s: int,
    reply: dict[str, Any] | None = None,
) -> None:
    """Hand the stored answer on, once: the run is succeeded, the answer is on its transcript
    and entry points, and it is kept sealed for `retention_s` more."""
    row = conn.execute(
        sa.text(
            f"""
            WITH d AS (
                UPDATE runs SET status = 'succeeded', finished_at = now(), updated_at = now(),
                       answer_expires_at = now() + make_interval(secs => :retention)
                WHERE id = :run_id AND attempt = :attempt AND status = 'answered'
                RETURNING id),
            t AS (
                INSERT INTO transcript_messages (run_id, role, content)
                SELECT id, 'assistant', :text FROM d)
            {ends_cte("d", success=True, outcome_sql=":text")}
            SELECT id FROM d
            """
        ),
        {
            "run_id": run_id,
            "attempt": attempt,
            "text": text,
            "retention": retention_s,
            "reply": json.dumps(reply) if reply is not None else None,
        },
    ).first()
    if row is None:
        raise FencedOut(run_id, attempt, "hand on the answer")


def answer_and_deliver(
    conn: sa.Connection,
    run_id: str,
    attempt: int,
    text: str,
    sealed_answer: bytes,
    *,
    retention_s: int,
) -> None:
    """Store the sealed answer and hand it on to entry points that live in Postgres
    (transcript, A2A task, cron record) in one statement, for the owning attempt only (I3):
    with nothing outside Postgres to tell, there is no moment between the two to crash in."""
    row = conn.execute(
        sa.text(
            f"""
            WITH d AS (
                UPDATE runs SET status = 'succeeded', answer = :answer, answered_at = now(),
                       finished_at = now(), updated_at = now(),
                       answer_expires_at = now() + make_interval(secs => :retention)
                WHERE id = :run_id AND attempt = :attempt AND status = 'running'
                RETURNING id),
            t AS (
                INSERT INTO transcript_messages (run_id, role, content)
                SELECT id, 'assistant', :text FROM d)
            {ends_cte("d", success=True, outcome_sql=":text")}
            SELECT id FROM d
            """
        ),
        {
            "run_id": run_id,
            "attempt": attempt,
            "text": text,
            "answer": sealed_answer,
            "retention": retention_s,
            "reply": None,
        },
    ).first()
    if row is None:
        raise FencedOut(run_id, attempt, "store and hand on the answer")


def purge_answers(conn: sa.Connection) -> int:
    """Clear the sealed answers of delivered runs whose retention is over."""
    result = conn.execute(
        sa.text(
            """
            UPDATE runs SET answer = NULL, answer_purged_at = now()
            WHERE status = 'succeeded' AND answer IS NOT NULL AND answer_expires_at < now()
            """
        )
    )
    return int(result.rowcount)


def get_a2a_task(conn: sa.Connection, task_id: str) -> sa.Row[Any] | None:
    return conn.execute(
        sa.text(
            "SELECT id, run_id, status, answer, created_at, updated_at FROM a2a_tasks "
            "WHERE id = :id"
        ),
        {"id": task_id},
    ).first()


def insert_teams_message(
    conn: sa.Connection,
    *,
    message_id: str,
    conversation: str,
    sender: str,
    agent: str,
    text: str,
) -> tuple[int, bool]:
    """Put a Teams message in the durable inbox once (by its message id); (row id, new)."""
    row = conn.execute(
        sa.text(
            """
            WITH i AS (
                INSERT INTO teams_inbox (message_id, conversation, sender, agent, text)
                VALUES (:m, :c, :s, :a, :t) ON CONFLICT (message_id) DO NOTHING RETURNING id)
            SELECT id, true AS new FROM i
            UNION ALL SELECT id, false FROM teams_inbox WHERE message_id = :m
              AND NOT EXISTS (SELECT 1 FROM i)
            """
        ),
        {"m": message_id, "c": conversation, "s": sender, "a": agent, "t": text},
    ).one()
    return int(row.id), bool(row.new)


def select_new_teams_messages(conn: sa.Connection, limit: int = 50) -> list[sa.Row[Any]]:
    """Inbox rows no turn has taken yet (two intakes reading one row still make one run)."""
    return list(
        conn.execute(
            sa.text(
                "SELECT id, message_id, conversation, sender, agent, text FROM teams_inbox "
                "WHERE status = 'new' ORDER BY id LIMIT :n"
            ),
            {"n": limit},
        ).all()
    )
