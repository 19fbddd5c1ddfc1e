"""Entry points: runs started by cron triggers, webhooks, ticket events, co-pilot turns, A2A
tasks and Teams messages, and the Teams reply that hands a turn's answer on, once."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote

from runtime.core import catalog
from runtime.core.enqueue import BadRequest, NewRun, check_definition, enqueue
from runtime.entries import teams_graph
from runtime.entries.bot_connector import BotConnector
from runtime.entries.teams_graph import ADAPTIVE_CARD
from runtime.sending.call_http import CallHTTP
from runtime.services import Services
from runtime.toolbox.tools import ToolError, vendor_json
from store.entries import (
    EntryLink,
    TeamsMessage,
    get_teams_message_of_run,
    insert_teams_message,
    select_new_teams_messages,
)
from store.rows import RunId, RunRow


def start_entry(
    s: Services,
    *,
    entry_kind: str,
    agent: str,
    user_input: str,
    request_key: str,
    owner: str,
    channel: str,
    entry: dict[str, Any] | None = None,
    link: EntryLink | None = None,
) -> tuple[RunId, bool]:
    """Start a catalog agent's run for an entry point, idempotently by its request key."""
    try:
        definition = s_catalog(s).agent(agent)
    except catalog.CatalogError as exc:
        raise BadRequest(str(exc)) from None
    return enqueue(
        s,
        NewRun(
            agent=agent,
            user_input=user_input,
            model=definition.model,
            tools=definition.tools,
            system=definition.system,
            owner=owner,
            entry_kind=entry_kind,
            channel=channel,
            request_key=request_key,
            entry=entry,
            link=link,
        ),
    )


def s_catalog(s: Services) -> catalog.Catalog:
    """The catalog file's agents and triggers, with the agents declared in tool modules."""
    return catalog.load(s.settings.agents_file).with_agents(s.tools.agents)


def fire_cron(s: Services, trigger_name: str, now: datetime | None = None) -> tuple[RunId, bool]:
    """Fire a cron trigger: one run per trigger and scheduled time, however many beats fire."""
    trigger = s_catalog(s).cron.get(trigger_name)
    if trigger is None:
        raise BadRequest(f"no cron trigger named {trigger_name!r} in the catalog")
    slot = trigger.slot(now or datetime.now(tz=UTC))
    return start_entry(
        s,
        entry_kind="cron",
        agent=trigger.agent,
        user_input=trigger.input,
        request_key=f"cron:{trigger.name}:{slot.isoformat()}",
        owner="cron",
        channel="cron",
        entry={"trigger": trigger.name, "scheduled_at": slot.isoformat()},
        link=EntryLink("cron", trigger.name, slot),
    )


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
        definition = s_catalog(s).agent(agent)
    except catalog.CatalogError as exc:
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
            entry_kind="teams",
            agent=row.agent,
            user_input=row.text,
            request_key=f"teams:{row.id}",
            owner=row.sender,
            channel="teams",
            entry={"conversation": row.conversation, "message_id": row.message_id},
            link=EntryLink("teams", str(row.id)),
        )
        if created:
            started.append(run_id)
    return started


def teams_cards(text: str, key: str) -> list[dict[str, Any]]:
    """The reply's attachments: the answer as an Adaptive Card whose text block has the run's
    reply key as its element id, which Microsoft Graph returns with the card, so a resumed
    hand-on finds the reply a lost attempt posted (`teams_graph.py`)."""
    return [
        {
            "contentType": ADAPTIVE_CARD,
            "content": {
                "type": "AdaptiveCard",
                "$schema": "http://adaptivecards.io/schemas/adaptive-card.json",
                "version": "1.5",
                "body": [{"type": "TextBlock", "id": key, "text": text, "wrap": True}],
            },
        }
    ]


def teams_reply_key(run_id: str) -> str:
    """The key a turn's reply is posted and found again with (Idempotency-Key)."""
    return f"lya-teams-reply-{run_id}"


def reply_activity(message: TeamsMessage, text: str, key: str) -> dict[str, Any]:
    """The reply to the turn's activity, as the Bot Connector takes it: from the bot to the
    person, in the same conversation, replying to their activity, with the answer as text and
    as an Adaptive Card that carries `key`."""
    incoming = message.activity or {}
    reply: dict[str, Any] = {
        "type": "message",
        "conversation": incoming.get("conversation") or {"id": message.conversation},
        "replyToId": message.message_id,
        "text": text,
        "textFormat": "plain",
        "attachments": teams_cards(text, key),
    }
    for ours, theirs in (("from", "recipient"), ("recipient", "from")):
        if isinstance(incoming.get(theirs), dict):
            reply[ours] = incoming[theirs]
    if incoming.get("channelId"):
        reply["channelId"] = incoming["channelId"]
    return reply


def post_teams_reply(s: Services, run: RunRow, text: str) -> dict[str, Any]:
    """Post the turn's reply with its card once, to the activity's Bot Connector (reply to
    activity: POST {serviceUrl}/v3/conversations/{id}/activities/{activityId}), as the bot:
    every request carries the bot's token (`bot_connector.py`).

    The first hand-on of an answer posts at once: no attempt posted before the answer was
    stored. A resumed one (the run was claimed `answered`: an earlier attempt may have posted
    and died before its delivery record) first reads the conversation back through Microsoft
    Graph for a reply carrying the run's key (`LIYAGENT_TEAMS_READ_BACK=on`, the default;
    `teams_graph.py`), and posts only when none shows once Graph's lag bound has passed. With
    `off` it posts without looking: a crash between the post and the delivery record can post
    it twice. A 4xx is a definite refusal (`ToolError`); a 5xx, a timeout or a token endpoint
    that cannot be reached leaves it in doubt (`ToolInDoubt`)."""
    with s.engine.connect() as conn:
        message = get_teams_message_of_run(conn, run.id)
    if message is None or not message.service_url:
        raise ToolError(
            f"run {run.id} has no Teams activity with a serviceUrl to reply to; "
            "the turn came in before the Bot Framework front, so answer it by hand"
        )
    key = teams_reply_key(run.id)
    call = CallHTTP.for_call(
        key=key,
        run_id=run.id,
        attempt=run.attempt,
        call="teams-reply",
        timeout_s=s.settings.timings.call_timeout_s,
    )
    if s.settings.teams_read_back and run.status == "answered":
        activity = message.activity or {"conversation": {"id": message.conversation}}
        place = teams_graph.place_of(s.settings, activity, run.answered_at)
        found = teams_graph.read_back(s.settings, call, place, key)
        if found is not None:
            # The reply a lost attempt posted: the same activity (the answer is sealed), by
            # the id Teams gave it.
            return {
                **reply_activity(message, text, key),
                "id": found.get("id"),
                "found_in": "graph",
            }
    target = (
        f"{message.service_url.rstrip('/')}/v3/conversations/"
        f"{quote(message.conversation, safe='')}/activities/{quote(message.message_id, safe='')}"
    )
    body = reply_activity(message, text, key)
    connector = BotConnector(s.settings, call)
    posted = vendor_json(f"POST {target}", lambda: connector.post(target, json=body))
    return {**body, "id": posted.get("id") if isinstance(posted, dict) else None}
