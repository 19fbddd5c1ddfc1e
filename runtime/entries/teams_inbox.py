"""Teams turns coming in: the durable inbox and its intake (the reply is `teams.py`).

The front (front/teams.py, which checks the channel's token) puts each message activity in the
durable inbox once (`receive_teams`, by conversation and activity id) before it answers the
channel, then starts its run (`intake_teams`, one run per inbox row, linked to the row in the
inserting statement; beat's intake starts any the front could not).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import structlog

from runtime.core.catalog import CatalogError
from runtime.core.enqueue import BadRequest, check_definition
from runtime.entries.start import catalog_agent, start_entry
from runtime.services import Services
from store.entries import EntryKind, EntryLink, insert_teams_message, select_new_teams_messages
from store.rows import RunId

log = structlog.get_logger(__name__)


@dataclass(frozen=True)
class TeamsTurn:
    """A Teams message as the Bot Framework delivered it (an activity of type message): where
    the reply goes (its serviceUrl and conversation), who asked, and what."""

    activity_id: str
    conversation: str
    service_url: str
    sender: str
    text: str
    activity: dict[str, Any]


def receive_teams(s: Services, turn: TeamsTurn, agent: str) -> tuple[int, bool]:
    """Put a Teams turn in the durable inbox (once per conversation and activity id), for
    `agent` to answer."""
    try:
        definition = catalog_agent(s.settings, s.tools, agent)
    except CatalogError as exc:
        raise BadRequest(str(exc)) from None
    check_definition(s, definition)  # refused now, not when the inbox row becomes a run
    with s.engine.connect() as conn:
        return insert_teams_message(
            conn,
            message_id=turn.activity_id,
            conversation=turn.conversation,
            sender=turn.sender,
            agent=agent,
            text=turn.text,
            service_url=turn.service_url,
            activity=turn.activity,
        )


def intake_teams(s: Services, limit: int = 50) -> list[RunId]:
    """Turn new inbox rows into runs; a row read by two intakes still makes one run (by the
    row's request key), linked to its row in the same statement."""
    with s.engine.connect() as conn:
        rows = select_new_teams_messages(conn, limit)
    started: list[RunId] = []
    for row in rows:
        run_id, created = start_entry(
            s,
            entry_kind=EntryKind.TEAMS,
            agent=row.agent,
            user_input=row.text,
            request_key=f"teams:{row.id}",
            owner=row.sender,
            channel="teams",
            entry={"conversation": row.conversation, "message_id": row.message_id},
            link=EntryLink(EntryKind.TEAMS, str(row.id)),
        )
        if created:
            started.append(run_id)
    return started


def receive_and_start(s: Services, turn: TeamsTurn, agent: str) -> tuple[int, bool]:
    """Store the turn in the durable inbox, then start its run now; if starting fails, the
    row is kept and beat's Teams intake starts it within a sweep interval. (inbox id, new)"""
    inbox_id, created = receive_teams(s, turn, agent)
    try:
        intake_teams(s)
    except Exception as exc:
        log.warning(
            "front.teams_intake_failed",
            inbox_id=inbox_id,
            error=repr(exc),
            next="the activity is kept; beat's Teams intake starts its run",
        )
    return inbox_id, created
