"""A Teams turn's reply read back through Microsoft Graph, so a resumed hand-on posts it once.

The Bot Connector can post, update and delete a bot's activities but lists none of them (its
`GET .../activities` answers 405), and a reply's id is known only from the answer to its post,
which a crash loses. Microsoft Graph does list a conversation's messages, with their Adaptive
Cards: the reply's card carries the run's key as the `id` of its text block (an element id is
part of the card, which Graph returns as the attachment's `content`, a JSON string; the
activity's `channelData` and the request's headers are not returned), so a reply from this bot
whose card holds the key is the one a lost attempt posted.

Where Graph shows a conversation (from the stored activity): a personal chat as
`/chats/19:{user's aadObjectId}_{bot's app id}@unq.gbl.spaces/messages`, a group chat as
`/chats/{conversation id}/messages`, a channel thread (`19:...;messageid=R`) as
`/teams/{channelData.team.aadGroupId}/channels/{channel id}/messages/R/replies`. A chat is read
newest first, from shortly before the answer was stored (`$filter` on `lastModifiedDateTime`,
the only time Graph filters from below), 50 messages a page; a thread's replies page by page.

Graph is asked with the bot's app-only token: client credentials at the tenant's token endpoint
(`LIYAGENT_TEAMS_GRAPH_TOKEN_URL`, `{tenant}` being the activity's tenant id) for
`LIYAGENT_TEAMS_GRAPH_SCOPE`, with the same app id and password as the connector's token, kept
per process like it (`bot_connector.py`). The app needs ChatMessage.Read.Chat (resource-specific
consent in its manifest) or Chat.Read.All for chats, ChannelMessage.Read.Group or
ChannelMessage.Read.All for channels. A refusal (400, 403, 404) fails the hand-on naming what to
grant; it never posts unverified. A 429, a 5xx or no answer leaves the reply in doubt.

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
from urllib.parse import quote

import httpx
import structlog

from runtime.base.settings import Settings
from runtime.entries.bot_connector import BotConnector, TokenSource
from runtime.sending import http
from runtime.sending.call_http import CallHTTP
from runtime.toolbox.tools import ToolError, ToolInDoubt

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
OFF = "set LIYAGENT_TEAMS_READ_BACK=off on the workers to post without reading back (a crash "
OFF += "between the post and its delivery record can then post the reply twice)"


@dataclass(frozen=True)
class Place:
    """Where Graph lists a conversation's messages, in which tenant, and what it takes."""

    url: str
    params: dict[str, str]
    tenant: str
    named: str
    permission: str


def place_of(settings: Settings, activity: dict[str, Any], since: datetime | None) -> Place:
    """The Graph collection that shows the reply to `activity` (the turn's stored activity);
    `ToolError` naming what the activity lacks when it cannot be told."""
    conversation = activity.get("conversation")
    conversation = conversation if isinstance(conversation, dict) else {}
    data = activity.get("channelData")
    data = data if isinstance(data, dict) else {}
    conv_id = str(conversation.get("id") or "")
    kind = conversation.get("conversationType")
    tenant = conversation.get("tenantId") or _field(data, "tenant", "id")
    if not isinstance(tenant, str) or not tenant:
        raise ToolError(
            f"the Teams activity of conversation {conv_id!r} names no tenant (conversation."
            f"tenantId or channelData.tenant.id), so its reply cannot be read back; {OFF}"
        )
    graph = settings.teams_graph_url
    base, thread, root = conv_id.partition(";messageid=")
    if kind == "personal" or (kind is None and conv_id.startswith("a:")):
        sender = activity.get("from")
        user = sender.get("aadObjectId") if isinstance(sender, dict) else None
        if not isinstance(user, str) or not user:
            raise ToolError(
                f"the personal Teams activity of conversation {conv_id!r} has no from."
                f"aadObjectId, so the chat its reply is in cannot be named; {OFF}"
            )
        return _chat(graph, f"19:{user}_{settings.teams_app_id}@unq.gbl.spaces", tenant, since)
    if kind == "channel" or thread:
        team = _field(data, "team", "aadGroupId")
        channel = _field(data, "channel", "id") or base
        if not (isinstance(team, str) and team and isinstance(channel, str) and root):
            raise ToolError(
                f"the channel Teams activity of conversation {conv_id!r} lacks channelData."
                f"team.aadGroupId or a thread (;messageid=), so its reply cannot be read back; "
                f"{OFF}"
            )
        return Place(
            f"{graph}/teams/{_q(team)}/channels/{_q(channel)}/messages/{_q(root)}/replies",
            {"$top": str(PAGE)},
            tenant,
            f"the replies of message {root} in channel {channel} of team {team}",
            "ChannelMessage.Read.Group (resource-specific consent) or ChannelMessage.Read.All",
        )
    return _chat(graph, conv_id, tenant, since)


def _chat(graph: str, chat: str, tenant: str, since: datetime | None) -> Place:
    params = {"$top": str(PAGE), "$orderby": "lastModifiedDateTime desc"}
    if since is not None:
        at = (since - CLOCK_SKEW).astimezone(UTC).isoformat(timespec="milliseconds")
        params["$filter"] = f"lastModifiedDateTime gt {at.replace('+00:00', 'Z')}"
    return Place(
        f"{graph}/chats/{_q(chat)}/messages",
        params,
        tenant,
        f"chat {chat}",
        "ChatMessage.Read.Chat (resource-specific consent) or Chat.Read.All",
    )


def _field(data: dict[str, Any], outer: str, inner: str) -> Any:
    value = data.get(outer)
    return value.get(inner) if isinstance(value, dict) else None


def _q(part: str) -> str:
    return quote(part, safe="")


def graph_tokens(settings: Settings, tenant: str) -> TokenSource:
    """The tenant's token endpoint for Microsoft Graph (app-only, client credentials)."""
    url = settings.teams_graph_token_url.replace("{tenant}", _q(tenant))
    return TokenSource(
        url,
        settings.teams_graph_scope,
        f"the Microsoft Graph token endpoint {url} (LIYAGENT_TEAMS_GRAPH_TOKEN_URL)",
        "LIYAGENT_TEAMS_APP_ID, the bot's app password, LIYAGENT_TEAMS_GRAPH_TOKEN_URL and "
        "LIYAGENT_TEAMS_GRAPH_SCOPE (and that the app is consented in the tenant)",
    )


def read_back(
    settings: Settings,
    call: CallHTTP,
    place: Place,
    key: str,
    *,
    sleep: Callable[[float], None] = time.sleep,
) -> dict[str, Any] | None:
    """The reply this bot posted with `key` as Graph shows it, or None once a read that began
    at least `LIYAGENT_TEAMS_GRAPH_SETTLE_MS` after this read-back did finds none."""
    graph = BotConnector(settings, call, graph_tokens(settings, place.tenant), "Microsoft Graph")
    trusted_from = time.monotonic() + settings.teams_graph_settle_ms / 1000
    reads = 0
    while True:
        reads += 1
        found = _find(settings, graph, place, key)
        if found is not None:
            log.info("teams.reply_found", reads=reads, message=found.get("id"))
            return found
        left = trusted_from - time.monotonic()
        if left <= 0:
            log.info("teams.reply_not_found", reads=reads, settle_ms=settings.teams_graph_settle_ms)
            return None
        http.check_send()  # waiting on is for an attempt that still holds its run
        sleep(min(left, POLL_S))


def _find(settings: Settings, graph: BotConnector, place: Place, key: str) -> dict[str, Any] | None:
    for message in _messages(settings, graph, place):
        if _is_ours(message, settings.teams_app_id, key):
            return message
    return None


def _messages(settings: Settings, graph: BotConnector, place: Place) -> Iterator[dict[str, Any]]:
    """Every message of `place`, page by page (the next links stay on the Graph URL)."""
    url: str | None = place.url
    params: dict[str, str] | None = place.params
    for _ in range(MAX_PAGES):
        assert url is not None
        page = _page(graph, place, url, params)
        values = page.get("value")
        yield from (m for m in values if isinstance(m, dict)) if isinstance(values, list) else ()
        url, params = page.get("@odata.nextLink"), None
        if url is None:
            return
        if not isinstance(url, str) or not url.startswith(settings.teams_graph_url + "/"):
            raise ToolError(f"Microsoft Graph sent a next link off {settings.teams_graph_url}")
    raise ToolError(
        f"{place.named} has more than {MAX_PAGES * PAGE} messages to read back the reply "
        f"from; {OFF}"
    )


def _page(
    graph: BotConnector, place: Place, url: str, params: dict[str, str] | None
) -> dict[str, Any]:
    what = f"GET {url}"
    try:
        response = graph.get(url, params=params)
    except (httpx.TimeoutException, httpx.NetworkError, httpx.RemoteProtocolError) as exc:
        raise ToolInDoubt(f"{what}: {type(exc).__name__}: {exc}") from exc
    except httpx.HTTPError as exc:
        raise ToolError(f"{what}: {exc}") from exc
    status = response.status_code
    if status >= 500 or status == 429:
        raise ToolInDoubt(f"{what}: Microsoft Graph answered {status}; a later attempt reads back")
    if status >= 400:
        raise ToolError(
            f"Microsoft Graph refused to list {place.named} ({status} {_graph_error(response)}), "
            f"so the reply cannot be read back before it is posted; grant the bot's app "
            f"{place.permission}, or {OFF}",
            status,
        )
    try:
        body: Any = response.json()
    except ValueError:
        raise ToolInDoubt(f"{what}: Microsoft Graph answered {status} without JSON") from None
    if not isinstance(body, dict):
        raise ToolInDoubt(f"{what}: Microsoft Graph answered {status} without a message list")
    return body


def _graph_error(response: httpx.Response) -> str:
    try:
        body: Any = response.json()
    except ValueError:
        return response.text[:200]
    error = body.get("error") if isinstance(body, dict) else None
    if isinstance(error, dict):
        return f"{error.get('code')}: {str(error.get('message') or '')[:200]}"
    return response.text[:200]


def _is_ours(message: dict[str, Any], app_id: str, key: str) -> bool:
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
