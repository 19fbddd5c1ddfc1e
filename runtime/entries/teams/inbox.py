"""Teams turns coming in: who sent one, the durable inbox, and its intake (the reply is
`reply.py`).

The front (front/teams.py, which checks the channel's token) puts each message activity in the
durable inbox once (`receive_teams`, by conversation and activity id) before it answers the
channel, then starts its run (`intake_teams`, one run per inbox row, linked to the row in the
inserting statement; beat's intake starts any the front could not).

Who a turn's run belongs to: the sender's Microsoft Entra object id, the `from.aadObjectId`
Teams sends with every message from a person of a tenant (a GUID, stored lower-case). It is the
run's owner, so an erasure by owner (`liyagent erase --owner`), a revoked owner (a `principals`
row of that name) and every gate name the person by it. The display name (`from.name`) is
never identity: two people may share one and anyone can change theirs. It stays only inside
the stored activity, content an erasure deletes with the turn's text. A message activity
without an aadObjectId (an anonymous meeting guest, a channel other than Teams) is refused and
nothing is stored; Bot Framework's `from.id` is the channel's own id of the user, so it is not
used as a fallback that would give one person two names.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import structlog

from runtime.core.catalog import CatalogError
from runtime.core.deps import DoorDeps
from runtime.core.enqueue import BadRequest, check_definition
from runtime.entries.start import catalog_agent, start_entry
from runtime.services import Services
from store.rows import RunId
from store.teams import KIND, insert_teams_message, select_new_teams_messages, teams_link

log = structlog.get_logger(__name__)

# An Entra object id as Teams sends it: a GUID, 8-4-4-4-12 hex digits.
_GUID = re.compile(r"[0-9a-f]{8}-(?:[0-9a-f]{4}-){3}[0-9a-f]{12}")
WHO = (
    "a Teams person is named by their Microsoft Entra object id (the activity's "
    "from.aadObjectId, a lower-case GUID), never by their display name"
)


def teams_owner(sender: Any) -> str:
    """The owner of a turn sent by `sender` (the activity's `from`): its aadObjectId,
    lower-case; BadRequest when it has none (nothing is stored then)."""
    aad = sender.get("aadObjectId") if isinstance(sender, dict) else None
    if not isinstance(aad, str) or not _GUID.fullmatch(aad.lower()):
        raise BadRequest(
            "the activity's from.aadObjectId, the sender's Microsoft Entra object id (a GUID), "
            "is required: a Teams turn's run is owned by it, never by a display name, so a "
            "message without one is not answered; nothing was stored"
        )
    return aad.lower()


@dataclass(frozen=True)
class TeamsTurn:
    """A Teams message as the Bot Framework delivered it (an activity of type message): where
    the reply goes (its serviceUrl and conversation), who asked (`sender_id`, their Entra
    object id: the run's owner) and what."""

    activity_id: str
    conversation: str
    service_url: str
    sender_id: str
    text: str
    activity: dict[str, Any]


def receive_teams(s: Services, turn: TeamsTurn, agent: str) -> tuple[int, bool]:
    """Put a Teams turn in the durable inbox (once per conversation and activity id), for
    `agent` to answer; BadRequest, nothing stored, for a sender that is not an Entra id."""
    if not _GUID.fullmatch(turn.sender_id):
        raise BadRequest(f"the turn's sender_id is not an Entra object id: {WHO}; nothing stored")
    try:
        definition = catalog_agent(s.settings, s.tools, agent)
    except CatalogError as exc:
        raise BadRequest(str(exc)) from None
    # Refused now, not when the inbox row becomes a run.
    check_definition(DoorDeps.of(s), definition)
    with s.engine.connect() as conn:
        return insert_teams_message(
            conn,
            message_id=turn.activity_id,
            conversation=turn.conversation,
            sender_id=turn.sender_id,
            agent=agent,
            text=turn.text,
            service_url=turn.service_url,
            activity=turn.activity,
        )


def intake_teams(s: Services, limit: int = 50) -> list[RunId]:
    """Turn new inbox rows into runs owned by their senders' Entra ids; a row read by two
    intakes still makes one run (by the row's request key), linked to its row in the same
    statement."""
    with s.engine.connect() as conn:
        rows = select_new_teams_messages(conn, limit)
    started: list[RunId] = []
    for row in rows:
        if row.sender_id is None:  # never selected: a new row has one (ck_teams_inbox_sender)
            continue
        run_id, created = start_entry(
            s,
            entry_kind=KIND,
            agent=row.agent,
            user_input=row.text,
            request_key=f"teams:{row.id}",
            owner=row.sender_id,
            channel="teams",
            # Sealed with the run: the reply goes only where the turn came from (reply.py).
            entry={
                "conversation": row.conversation,
                "message_id": row.message_id,
                "service_url": row.service_url,
            },
            link=teams_link(row.id),
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
