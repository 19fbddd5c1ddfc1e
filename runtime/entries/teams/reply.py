"""Teams through the Bot Framework: the whole entry kind.

Starts: from the durable inbox, one run per message activity, owned by the sender's Microsoft
Entra object id, never their display name (`inbox.py`).

Hands on: the answer leaves Postgres (a reply posted to the Bot Connector), so it is stored
first and a resume hands that stored answer on, never running the turn again
(`TeamsEntry.hand_on`, `post_teams_reply`); the inbox row gets the reply in the delivering
statement. Told of a failure: the inbox row is marked failed in the failing statement
(`store.teams.teams_end`, in `store.entries.ends_cte`); a reply refused for good (4xx) fails
the run (`HandOnRefused`).

The reply is posted as the bot, with its token (`connector.py`). A resumed hand-on first
reads the conversation back through Microsoft Graph for the reply a lost attempt may have
posted (`graph.py`), finding the Graph ids a message activity lacks through the calls
Microsoft documents for them (`ids.py`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any
from urllib.parse import quote

from runtime.core.entry import HandOnDeps, HandOnRefused
from runtime.durable.definition import RunDefinition
from runtime.entries.start import ENTRY_POINT_RUN
from runtime.entries.teams.connector import BotConnector
from runtime.entries.teams.graph import ADAPTIVE_CARD, locate, read_back
from runtime.entries.teams.settings import TeamsSettings, teams_settings
from runtime.sending.call_http import CallHTTP
from runtime.toolbox.tools import ToolError, vendor_json
from store.rows import RunRow
from store.teams import KIND, TeamsMessage, get_teams_message_of_run

# ---- Handing on: the reply, posted once --------------------------------------------------


class TeamsEntry:
    """The Teams entry point: its answer is a reply posted to the turn's Bot Connector."""

    kinds = frozenset({KIND})
    outside = True
    policy = ENTRY_POINT_RUN
    settings_type = TeamsSettings

    def hand_on(
        self, s: HandOnDeps, run: RunRow, definition: RunDefinition, text: str
    ) -> dict[str, Any] | None:
        """Post the reply once (`post_teams_reply`), to the Bot Connector its sealed definition
        names; a definite refusal fails the run."""
        try:
            return post_teams_reply(s, run, text, definition.entry)
        except ToolError as exc:
            raise HandOnRefused(str(exc)) from None


ENTRY = TeamsEntry()


def _moved_from(message: TeamsMessage, sealed: Mapping[str, Any]) -> str | None:
    """Which of the inbox row's reply targets differs from the run's sealed entry details, if
    any (a run stored before they were sealed has none to compare: its row is used)."""
    for field in ("service_url", "conversation", "message_id"):
        if field in sealed and sealed[field] != getattr(message, field):
            return field
    return None


def teams_cards(text: str, key: str) -> list[dict[str, Any]]:
    """The reply's attachments: the answer as an Adaptive Card whose text block has the run's
    reply key as its element id, which Microsoft Graph returns with the card, so a resumed
    hand-on finds the reply a lost attempt posted (`read_back`)."""
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


def post_teams_reply(
    s: HandOnDeps, run: RunRow, text: str, sealed: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """Post the turn's reply with its card once, to the activity's Bot Connector (reply to
    activity: POST {serviceUrl}/v3/conversations/{id}/activities/{activityId}), as the bot:
    every request carries the bot's token (`BotConnector`).

    The first hand-on of an answer posts at once: no attempt posted before the answer was
    stored. A resumed one (the run was claimed `answered`: an earlier attempt may have posted
    and died before its delivery record) first reads the conversation back through Microsoft
    Graph for a reply carrying the run's key (`LIYAGENT_TEAMS_READ_BACK=on`, the default;
    `read_back`), and posts only when none shows once Graph's lag bound has passed. With
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
    moved = _moved_from(message, sealed or {})
    if moved:
        # The bot's token goes wherever the reply is posted: only where the run was started.
        raise ToolError(
            f"run {run.id}: its Teams turn's {moved} differs from the one sealed with the run; "
            "the reply was not posted (check who changed the database)"
        )
    key = teams_reply_key(run.id)
    call = CallHTTP.for_call(
        key=key,
        run_id=run.id,
        attempt=run.attempt,
        call="teams-reply",
        timeout_s=s.settings.timings.call_timeout_s,
    )
    settings = teams_settings()
    if settings.read_back and run.status == "answered":
        activity = message.activity or {"conversation": {"id": message.conversation}}
        place = locate(settings, call, message.service_url, activity, run.answered_at)
        found = read_back(settings, call, place, key)
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
    connector = BotConnector(settings, call)
    posted = vendor_json(f"POST {target}", lambda: connector.post(target, json=body))
    return {**body, "id": posted.get("id") if isinstance(posted, dict) else None}
