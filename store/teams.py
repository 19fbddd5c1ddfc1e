"""Teams' statements: the durable inbox (a turn stored once), the run linked to its row in the
run's inserting statement, the reply or failure landed there in the ending one."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa

from store.db import sql
from store.entry_links import EntryLink

KIND = "teams"


def teams_link(inbox_id: int) -> EntryLink:
    """The inbox row whose turn the run answers: marked running with the run's id."""
    return EntryLink(
        KIND,
        "link AS (UPDATE teams_inbox SET status = 'running', run_id = r.id FROM r "
        "WHERE teams_inbox.id = CAST(:link_ref AS bigint))",
        {"link_ref": str(inbox_id)},
    )


def teams_end(source: str, *, success: bool, outcome_sql: str, where: str) -> str:
    """The inbox row replied, with the posted reply (the statement's `:reply`), or failed
    (`EntryEnd`); the outcome is on the run."""
    status = "replied" if success else "failed"
    reply = ", reply = CAST(:reply AS jsonb), replied_at = now()" if success else ""
    return f"""e_teams AS (
        UPDATE teams_inbox SET status = '{status}'{reply}
        FROM {source} WHERE teams_inbox.run_id = {source}.id AND {where})"""


def insert_teams_message(
    conn: sa.Connection,
    *,
    message_id: str,
    conversation: str,
    sender_id: str,
    agent: str,
    text: str,
    service_url: str | None = None,
    activity: dict[str, Any] | None = None,
) -> tuple[int, bool]:
    """Put a Teams turn (an activity) in the durable inbox once, by its conversation and
    activity id, with its sender's Entra object id (the run's owner); returns (row id, new)."""
    row = conn.execute(
        sql(
            """
            WITH i AS (
                INSERT INTO teams_inbox
                    (message_id, conversation, sender_id, agent, text, service_url, activity)
                VALUES (:m, :c, :s, :a, :t, :u, CAST(:act AS jsonb))
                ON CONFLICT (conversation, message_id) DO NOTHING RETURNING id)
            SELECT id, true AS new FROM i
            UNION ALL SELECT id, false FROM teams_inbox WHERE conversation = :c
              AND message_id = :m AND NOT EXISTS (SELECT 1 FROM i)
            """
        ),
        {
            "m": message_id,
            "c": conversation,
            "s": sender_id,
            "a": agent,
            "t": text,
            "u": service_url,
            "act": None if activity is None else json.dumps(activity),
        },
    ).one()
    return int(row.id), bool(row.new)


@dataclass(frozen=True)
class TeamsMessage:
    """One inbox row: the activity a turn answers and where its reply goes."""

    id: int
    message_id: str
    conversation: str
    # The sender's Entra object id (the run's owner); None only on a turn stored before 0014
    # whose activity named none, which is never started.
    sender_id: str | None
    agent: str
    text: str
    service_url: str | None
    activity: dict[str, Any] | None


_TEAMS_COLUMNS = "id, message_id, conversation, sender_id, agent, text, service_url, activity"


def select_new_teams_messages(conn: sa.Connection, limit: int = 50) -> list[TeamsMessage]:
    """Inbox rows no turn has taken yet (two intakes reading one row still make one run)."""
    rows = conn.execute(
        sql(f"SELECT {_TEAMS_COLUMNS} FROM teams_inbox WHERE status = 'new' ORDER BY id LIMIT :n"),
        {"n": limit},
    ).all()
    return [TeamsMessage(**r._mapping) for r in rows]


def get_teams_message_of_run(conn: sa.Connection, run_id: str) -> TeamsMessage | None:
    """The inbox row whose turn this run is, or None."""
    row = conn.execute(
        sql(f"SELECT {_TEAMS_COLUMNS} FROM teams_inbox WHERE run_id = CAST(:r AS uuid)"),
        {"r": run_id},
    ).first()
    return None if row is None else TeamsMessage(**row._mapping)
