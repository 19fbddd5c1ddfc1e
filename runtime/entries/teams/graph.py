"""A turn's reply read back through Microsoft Graph, so a resumed hand-on posts it once.

The Bot Connector can post, update and delete a bot's activities but lists none of them (its
`GET .../activities` answers 405), and a reply's id is known only from the answer to its post,
which a crash loses. Microsoft Graph does list a conversation's messages, with their Adaptive
Cards: the reply's card carries the run's key as the `id` of its text block (an element id is
part of the card, which Graph returns as the attachment's `content`, a JSON string; the
activity's `channelData` and the request's headers are not returned), so a reply from this bot
whose card holds the key is the one a lost attempt posted.

Where Graph shows a conversation (`locate`, from the stored activity): a group chat as
`/chats/{conversation id}/messages`; a personal chat as `/chats/{chat id}/messages`, the chat id
asked of Graph; a channel thread (`19:...;messageid=R`) as `/teams/{group id}/channels/{channel
id}/messages/R/replies`, the team's group id asked of the Bot Connector (`ids.py`: a
message activity carries neither). A chat is read newest first, from shortly before the answer
was stored (`$filter` on `lastModifiedDateTime`, the only time Graph filters from below), 50
messages a page; a thread's replies page by page.

Graph is asked with the bot's app-only token (`connector.graph`). The app needs
ChatMessage.Read.Chat (resource-specific consent) or Chat.Read.All to list chats,
ChannelMessage.Read.Group (resource-specific consent) or ChannelMessage.Read.All for channels
(Microsoft counts app-only reads of messages among its protected APIs), and what `ids.py`
names to find a personal chat. A refusal (400, 403, 404) fails the hand-on naming what to
grant; it never posts unverified. A 429, a 5xx or no answer is tried again and then leaves the
reply in doubt.

Graph shows a message a short while after the connector took it. An empty read is therefore
trusted only once `LIYAGENT_TEAMS_GRAPH_SETTLE_MS` has passed since the read-back began: every
post a lost attempt made left before this attempt claimed the run (the send guard), so a post
Graph shows within that bound is found.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import structlog

from runtime.entries.teams.connector import OFF, BotConnector, Refusal, graph, q, read_json
from runtime.entries.teams.ids import personal_chat_id, team_group_id
from runtime.entries.teams.settings import TeamsSettings
from runtime.sending import http
from runtime.sending.call_http import CallHTTP
from runtime.toolbox.tools import ToolError

log = structlog.get_logger(__name__)

ADAPTIVE_CARD = "application/vnd.microsoft.card.adaptive"
# Graph's largest page.
PAGE = 50
# Pages read at most in one pass (2,500 messages since the answer was stored, or replies).
MAX_PAGES = 50
# How far before the answer was stored a chat is read from: clocks apart (ours, Microsoft's).
CLOCK_SKEW = timedelta(minutes=5)
# How often an empty read is repeated while Graph's lag has not passed.
POLL_S = 1.0
CHATS = "ChatMessage.Read.Chat (resource-specific consent) or Chat.Read.All"
CHANNELS = "ChannelMessage.Read.Group (resource-specific consent) or ChannelMessage.Read.All"


@dataclass(frozen=True)
class Conversation:
    """What a stored activity says of its conversation: its id, kind (`personal`, `groupChat`
    or `channel`) and tenant, and what each kind is found by: the sender's Entra object id (a
    personal chat), the team's thread id, the channel and the thread's root (a channel)."""

    id: str
    kind: str
    tenant: str
    user: str = ""
    team: str = ""
    channel: str = ""
    root: str = ""

    @classmethod
    def of(cls, activity: dict[str, Any]) -> Conversation:
        """The conversation of `activity`; `ToolError` naming what it lacks to be found."""
        conversation = _dict(activity.get("conversation"))
        data = _dict(activity.get("channelData"))
        conv_id = str(conversation.get("id") or "")
        kind = conversation.get("conversationType")
        tenant = conversation.get("tenantId") or _dict(data.get("tenant")).get("id")
        if not isinstance(tenant, str) or not tenant:
            raise ToolError(
                f"the Teams activity of conversation {conv_id!r} names no tenant (conversation."
                f"tenantId or channelData.tenant.id), so its reply cannot be read back; {OFF}"
            )
        base, thread, root = conv_id.partition(";messageid=")
        if kind == "personal" or (kind is None and conv_id.startswith("a:")):
            user = _dict(activity.get("from")).get("aadObjectId")
            if not isinstance(user, str) or not user:
                raise ToolError(
                    f"the personal Teams activity of conversation {conv_id!r} has no from."
                    f"aadObjectId, so the chat its reply is in cannot be found; {OFF}"
                )
            return cls(conv_id, "personal", tenant, user=user)
        if kind == "channel" or thread:
            team = _dict(data.get("team")).get("id")
            channel = _dict(data.get("channel")).get("id") or base
            if not (isinstance(team, str) and team and isinstance(channel, str) and root):
                raise ToolError(
                    f"the channel Teams activity of conversation {conv_id!r} lacks channelData."
                    f"team.id or a thread (;messageid=), so its reply cannot be read back; {OFF}"
                )
            return cls(conv_id, "channel", tenant, team=team, channel=channel, root=root)
        return cls(conv_id, "groupChat", tenant)


@dataclass(frozen=True)
class Place:
    """Where Graph lists a conversation's messages, in which tenant, and what it takes."""

    url: str
    params: dict[str, str]
    tenant: str
    named: str
    permission: str


def locate(
    settings: TeamsSettings,
    call: CallHTTP,
    service_url: str,
    activity: dict[str, Any],
    since: datetime | None,
) -> Place:
    """The Graph collection that shows the reply to `activity` (the turn's stored activity,
    from the Bot Connector at `service_url`), its ids asked of the calls documented for them."""
    conv = Conversation.of(activity)
    if conv.kind == "personal":
        service = graph(settings, call, conv.tenant)
        chat = personal_chat_id(settings, service, conv.tenant, conv.user)
        return chat_place(settings, chat, conv.tenant, since)
    if conv.kind == "channel":
        group = team_group_id(settings, call, service_url, conv.team)
        return thread_place(settings, group, conv.channel, conv.root, conv.tenant)
    return chat_place(settings, conv.id, conv.tenant, since)


def chat_place(settings: TeamsSettings, chat: str, tenant: str, since: datetime | None) -> Place:
    """A chat's messages, newest first, from shortly before `since`."""
    params = {"$top": str(PAGE), "$orderby": "lastModifiedDateTime desc"}
    if since is not None:
        at = (since - CLOCK_SKEW).astimezone(UTC).isoformat(timespec="milliseconds")
        params["$filter"] = f"lastModifiedDateTime gt {at.replace('+00:00', 'Z')}"
    url = f"{settings.graph_url}/chats/{q(chat)}/messages"
    return Place(url, params, tenant, f"chat {chat}", CHATS)


def thread_place(
    settings: TeamsSettings, group: str, channel: str, root: str, tenant: str
) -> Place:
    """The replies to message `root` in `channel` of the team whose group id is `group`."""
    url = f"{settings.graph_url}/teams/{q(group)}/channels/{q(channel)}/messages/{q(root)}"
    named = f"the replies of message {root} in channel {channel} of team {group}"
    return Place(f"{url}/replies", {"$top": str(PAGE)}, tenant, named, CHANNELS)


def read_back(
    settings: TeamsSettings,
    call: CallHTTP,
    place: Place,
    key: str,
    *,
    sleep: Callable[[float], None] = time.sleep,
) -> dict[str, Any] | None:
    """The reply this bot posted with `key` as Graph shows it, or None once a read that began
    at least `LIYAGENT_TEAMS_GRAPH_SETTLE_MS` after this read-back did finds none."""
    service = graph(settings, call, place.tenant)
    trusted_from = time.monotonic() + settings.graph_settle_ms / 1000
    reads = 0
    while True:
        reads += 1
        found = _find(settings, service, place, key)
        if found is not None:
            log.info("teams.reply_found", reads=reads, message=found.get("id"))
            return found
        left = trusted_from - time.monotonic()
        if left <= 0:
            log.info("teams.reply_not_found", reads=reads, settle_ms=settings.graph_settle_ms)
            return None
        http.check_send()  # waiting on is for an attempt that still holds its run
        sleep(min(left, POLL_S))


def _find(
    settings: TeamsSettings, service: BotConnector, place: Place, key: str
) -> dict[str, Any] | None:
    for message in _messages(settings, service, place):
        if is_ours(message, settings.app_id, key):
            return message
    return None


def _messages(
    settings: TeamsSettings, service: BotConnector, place: Place
) -> Iterator[dict[str, Any]]:
    """Every message of `place`, page by page (the next links stay on the Graph URL)."""
    refusal = Refusal(f"to list {place.named}", f"grant the bot's app {place.permission}")
    url: str | None = place.url
    params: dict[str, str] | None = place.params
    for _ in range(MAX_PAGES):
        assert url is not None
        page = read_json(service, url, params, refusal)
        values = page.get("value")
        yield from (m for m in values if isinstance(m, dict)) if isinstance(values, list) else ()
        url, params = page.get("@odata.nextLink"), None
        if url is None:
            return
        if not isinstance(url, str) or not url.startswith(settings.graph_url + "/"):
            raise ToolError(f"Microsoft Graph sent a next link off {settings.graph_url}")
    raise ToolError(
        f"{place.named} has more than {MAX_PAGES * PAGE} messages to read back the reply "
        f"from; {OFF}"
    )


def is_ours(message: dict[str, Any], app_id: str, key: str) -> bool:
    """Whether `message` was posted by this bot with a card that carries `key`."""
    sender = message.get("from")
    app = sender.get("application") if isinstance(sender, dict) else None
    if not isinstance(app, dict) or app.get("id") != app_id:
        return False
    for attachment in message.get("attachments") or ():
        if not isinstance(attachment, dict) or attachment.get("contentType") != ADAPTIVE_CARD:
            continue
        content = attachment.get("content")
        if isinstance(content, str):
            try:
                content = json.loads(content)
            except ValueError:
                continue
        if _carries(content, key):
            return True
    return False


def _carries(node: Any, key: str) -> bool:
    """Whether a card (or any element in it) has `key` as its id."""
    if isinstance(node, dict):
        return node.get("id") == key or any(_carries(v, key) for v in node.values())
    if isinstance(node, list):
        return any(_carries(v, key) for v in node)
    return False


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}
