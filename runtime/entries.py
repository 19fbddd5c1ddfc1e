"""Entry points: runs started by cron triggers, webhooks, ticket events, co-pilot turns, A2A
tasks and Teams messages, and the Teams reply that hands a turn's answer on, once."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from runtime import catalog
from runtime.call_http import CallHTTP
from runtime.enqueue import BadRequest, NewRun, enqueue
from runtime.services import Services
from runtime.tools import vendor_json
from store.entries import EntryLink, insert_teams_message, select_new_teams_messages
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


def receive_teams(
    s: Services, *, message_id: str, conversation: str, sender: str, agent: str, text: str
) -> tuple[int, bool]:
    """Put a Teams message in the durable inbox (once per message id)."""
    s_catalog(s).agent(agent)
    with s.engine.connect() as conn:
        return insert_teams_message(
            conn,
            message_id=message_id,
            conversation=conversation,
            sender=sender,
            agent=agent,
            text=text,
        )


def intake_teams(s: Services, limit: int = 50) -> list[RunId]:
    """Turn new inbox rows into runs; a row read by two intakes still makes one run (by the
    message's request key), linked to its row in the same statement."""
    with s.engine.connect() as conn:
        rows = select_new_teams_messages(conn, limit)
    started: list[RunId] = []
    for row in rows:
        run_id, created = start_entry(
            s,
            entry_kind="teams",
            agent=row.agent,
            user_input=row.text,
            request_key=f"teams:{row.message_id}",
            owner=row.sender,
            channel="teams",
            entry={"conversation": row.conversation, "message_id": row.message_id},
            link=EntryLink("teams", str(row.id)),
        )
        if created:
            started.append(run_id)
    return started


def teams_cards(text: str) -> list[dict[str, Any]]:
    return [
        {
            "contentType": "application/vnd.microsoft.card.adaptive",
            "content": {
                "type": "AdaptiveCard",
                "version": "1.5",
                "body": [{"type": "TextBlock", "text": text, "wrap": True}],
            },
        }
    ]


def post_teams_reply(s: Services, run: RunRow, text: str) -> dict[str, Any]:
    """Post the turn's reply with its cards once: read it back by its key first (after this
    attempt's claim), so an attempt resumed after a crash finds a reply already posted instead
    of posting it again. What remains: a lost attempt's post still being processed by the chat
    service when this read-back runs (the send guard abandoned it before the claim)."""
    key = f"lya-teams-reply-{run.id}"
    base = s.settings.vendor_url.rstrip("/")
    http = CallHTTP.for_call(
        key=key,
        run_id=run.id,
        attempt=run.attempt,
        call="teams-reply",
        timeout_s=s.settings.timings.call_timeout_s,
    )
    found = vendor_json(
        "GET /chat/replies", lambda: http.get(f"{base}/chat/replies", params={"key": key})
    )
    if found:
        return dict(found[0])
    conversation = str((run.spec.get("entry") or {}).get("conversation") or run.id)
    body = {"conversation": conversation, "text": text, "cards": teams_cards(text)}
    posted = vendor_json("POST /chat/replies", lambda: http.post(f"{base}/chat/replies", json=body))
    return dict(posted)
