"""Teams through the Bot Framework: the whole entry kind.

Starts: from the durable inbox, one run per message activity, owned by the sender's Microsoft
Entra object id, never their display name (`teams_inbox.py`).

Hands on: the answer leaves Postgres (a reply posted to the Bot Connector), so it is stored
first and a resume hands that stored answer on, never running the turn again
(`TeamsEntry.hand_on`, `post_teams_reply`); the inbox row gets the reply in the delivering
statement. Told of a failure: the inbox row is marked failed in the failing statement
(`store.entries.ends_cte`); a reply refused for good (4xx) fails the run (`HandOnRefused`).

The bot's side of the Bot Connector (its token, requests that carry it):

A real tenant refuses a reply that does not carry the bot's token. The token comes from the
OAuth 2.0 client-credentials flow: the bot's app id (`LIYAGENT_TEAMS_APP_ID`) and app password
(read when needed from `LIYAGENT_TEAMS_APP_PASSWORD_FILE`, or from the environment variable
`LIYAGENT_TEAMS_APP_PASSWORD_ENV` names, `LIYAGENT_TEAMS_APP_PASSWORD` by default) are posted
to the token endpoint (`LIYAGENT_TEAMS_TOKEN_URL`) for the connector's scope
(`LIYAGENT_TEAMS_TOKEN_SCOPE`). The token is kept per process until shortly before it expires
(a tenth of its lifetime, at most five minutes, early), and the request for it goes through
this process's guarded client (`http.py`), so an attempt that lost its lease sends nothing.

Every connector request carries `Authorization: Bearer <token>`. A 401 from the connector means
it refused the token and did nothing, so the token is fetched again once and the request sent
once more: a refused token is not a refused reply. A second 401 is a definite refusal.

A token endpoint that cannot be reached, times out, or answers 5xx or 429 leaves the reply in
doubt (`ToolInDoubt`: the attempt ends as a crash does and a later attempt reads the reply back
and posts it); one that refuses the credentials (4xx) is a definite refusal (`ToolError`) that
names the settings to fix.

A turn's reply read back through Microsoft Graph, so a resumed hand-on posts it once:

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
per process like it (`BotConnector`). The app needs ChatMessage.Read.Chat (resource-specific
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
import math
import os
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import structlog

from runtime.base.settings import Settings
from runtime.core.entry import HandOnRefused
from runtime.durable.definition import RunDefinition
from runtime.sending import http
from runtime.sending.call_http import CallHTTP
from runtime.services import Services
from runtime.toolbox.tools import ToolError, ToolInDoubt, vendor_json
from store.entries import EntryKind, TeamsMessage, get_teams_message_of_run
from store.rows import RunRow

log = structlog.get_logger(__name__)


# ---- Handing on: the reply, posted once --------------------------------------------------


class TeamsEntry:
    """The Teams entry point: its answer is a reply posted to the turn's Bot Connector."""

    kinds = frozenset({EntryKind.TEAMS})
    outside = True

    def hand_on(
        self, s: Services, run: RunRow, definition: RunDefinition, text: str
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
    s: Services, run: RunRow, text: str, sealed: Mapping[str, Any] | None = None
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
    if s.settings.teams_read_back and run.status == "answered":
        activity = message.activity or {"conversation": {"id": message.conversation}}
        place = place_of(s.settings, activity, run.answered_at)
        found = read_back(s.settings, call, place, key)
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


# ---- The Bot Connector: the bot's token and requests that carry it ----------------------

# A token is given up this long (or a tenth of its lifetime, if shorter) before it expires.
REFRESH_BEFORE_S = 300.0


@dataclass(frozen=True)
class _Token:
    value: str
    # Monotonic time after which the token is fetched again.
    use_until: float


@dataclass(frozen=True)
class TokenSource:
    """Where the bot's token for one service comes from: the token endpoint, the scope asked
    for, and how to name both in an error (the settings that choose them)."""

    url: str
    scope: str
    what: str
    settings_named: str


def connector_tokens(settings: Settings) -> TokenSource:
    """The Bot Connector's: Microsoft's `botframework.com` endpoint (or the setting's)."""
    url = settings.teams_token_url
    return TokenSource(
        url,
        settings.teams_token_scope,
        f"the Bot Framework token endpoint {url} (LIYAGENT_TEAMS_TOKEN_URL)",
        "LIYAGENT_TEAMS_APP_ID, the bot's app password and LIYAGENT_TEAMS_TOKEN_SCOPE",
    )


_lock = threading.Lock()
# (process, token URL, app id, scope) -> the token in use.
_tokens: dict[tuple[int, str, str, str], _Token] = {}


def bot_token(
    settings: Settings,
    headers: dict[str, str],
    timeout_s: float,
    *,
    refused: str | None = None,
    source: TokenSource | None = None,
) -> str:
    """The bot's bearer token for a service (the Bot Connector unless `source` names another):
    the one this process holds while it is not about to expire, else a new one from the token
    endpoint. `refused` is a token the service has just answered 401 to: it is replaced (once,
    however many requests saw it refused)."""
    source = source or connector_tokens(settings)
    key = (os.getpid(), source.url, settings.teams_app_id, source.scope)
    with _lock:
        held = _tokens.get(key)
        if held is not None and held.value != refused and time.monotonic() < held.use_until:
            return held.value
        fresh = _fetch(settings, source, headers, timeout_s)
        _tokens[key] = fresh
        return fresh.value


def app_password(settings: Settings) -> str:
    """The bot's app password, read now; `ToolError` naming the setting when there is none."""
    path = settings.teams_app_password_file
    if path:
        where = f"the file {path} (LIYAGENT_TEAMS_APP_PASSWORD_FILE)"
        try:
            value = Path(path).read_text(encoding="utf-8").rstrip("\r\n")
        except OSError as exc:
            raise ToolError(f"the bot's app password cannot be read from {where}: {exc}") from None
    else:
        where = f"the environment variable {settings.teams_app_password_env}"
        value = os.environ.get(settings.teams_app_password_env, "")
    if not value:
        raise ToolError(
            f"the Teams bot has no app password to authenticate its replies with; put it in "
            f"{where} on the workers (LIYAGENT_TEAMS_APP_PASSWORD_ENV or "
            "LIYAGENT_TEAMS_APP_PASSWORD_FILE choose where it is read from)"
        )
    return value


def _fetch(
    settings: Settings, source: TokenSource, headers: dict[str, str], timeout_s: float
) -> _Token:
    """A new token from the token endpoint (client credentials)."""
    if not settings.teams_app_id:
        raise ToolError(
            "the workers have no Teams bot to authenticate replies as; set "
            "LIYAGENT_TEAMS_APP_ID (and the bot's app password) on them"
        )
    url = source.url
    form = {
        "grant_type": "client_credentials",
        "client_id": settings.teams_app_id,
        "client_secret": app_password(settings),
        "scope": source.scope,
    }
    what = source.what
    later = "the reply is in doubt and a later attempt reads it back and posts it"
    sent = time.monotonic()
    try:
        with http.total_timeout(timeout_s):
            response = http.shared_client().post(url, data=form, headers=headers, timeout=timeout_s)
    except (httpx.TimeoutException, httpx.NetworkError, httpx.RemoteProtocolError) as exc:
        why = f"{type(exc).__name__}: {exc}"
        raise ToolInDoubt(f"{what} cannot be reached now ({why}); {later}") from exc
    except httpx.HTTPError as exc:
        raise ToolError(f"{what} cannot be asked ({exc}); fix the setting") from None
    status = response.status_code
    if status >= 500 or status == 429:
        raise ToolInDoubt(f"{what} answered {status}; {later}")
    if status >= 400:
        raise ToolError(
            f"{what} refused the bot's credentials ({status} {_oauth_error(response)}); check "
            f"{source.settings_named}",
            status,
        )
    token, lifetime = _granted(response)
    if token is None:
        raise ToolInDoubt(f"{what} answered {status} without a usable access token; {later}")
    log.info("teams.token_fetched", expires_in_s=lifetime)
    return _Token(token, sent + lifetime - min(REFRESH_BEFORE_S, lifetime / 10))


def _granted(response: httpx.Response) -> tuple[str | None, float]:
    """The access token and its lifetime in seconds from a token answer (None if unusable)."""
    try:
        body: Any = response.json()
    except ValueError:
        return None, 0.0
    if not isinstance(body, dict):
        return None, 0.0
    token, expires_in = body.get("access_token"), body.get("expires_in")
    if isinstance(expires_in, bool) or not isinstance(expires_in, int | float | str):
        return None, 0.0
    try:
        lifetime = float(expires_in)  # some endpoints send it as a string
    except ValueError:
        return None, 0.0
    if not isinstance(token, str) or not token or not (lifetime > 0 and math.isfinite(lifetime)):
        return None, 0.0
    return token, lifetime


def _oauth_error(response: httpx.Response) -> str:
    try:
        body: Any = response.json()
    except ValueError:
        return response.text[:200]
    if isinstance(body, dict) and body.get("error"):
        return f"{body.get('error')}: {str(body.get('error_description') or '')[:200]}"
    return response.text[:200]


class BotConnector:
    """Requests to one of the bot's services for one call: the call's identity headers and
    timeout (`CallHTTP`) plus the bot's bearer token for that service (the Bot Connector by
    default), fetched again once when the service refuses it."""

    def __init__(
        self,
        settings: Settings,
        call: CallHTTP,
        source: TokenSource | None = None,
        service: str = "the Bot Connector",
    ) -> None:
        self.settings = settings
        self.call = call
        self.source = source or connector_tokens(settings)
        self.service = service
        # The token request names the run and attempt (for the records) but has no key.
        self._token_headers = {
            k: v for k, v in call.headers.items() if k.lower() != "idempotency-key"
        } | {"X-Liyagent-Call": "teams-token"}

    def _token(self, refused: str | None = None) -> str:
        return bot_token(
            self.settings,
            self._token_headers,
            self.call.timeout_s,
            refused=refused,
            source=self.source,
        )

    def request(self, method: str, url: str, **kwargs: Any) -> httpx.Response:
        """One request with the bot's token; on 401, once more with a new token."""
        token = self._token()
        response = self.call.request(method, url, headers=_bearer(token), **kwargs)
        if response.status_code != 401:
            return response
        log.info("teams.token_refused", method=method, next="fetching a new token, once")
        token = self._token(refused=token)
        response = self.call.request(method, url, headers=_bearer(token), **kwargs)
        if response.status_code == 401:
            raise ToolError(
                f"{method} {url}: {self.service} refused the bot's token twice (401), a new "
                f"one included; check {self.source.settings_named}",
                401,
            )
        return response

    def get(self, url: str, **kwargs: Any) -> httpx.Response:
        return self.request("GET", url, **kwargs)

    def post(self, url: str, **kwargs: Any) -> httpx.Response:
        return self.request("POST", url, **kwargs)


def _bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


# ---- Microsoft Graph: reading a reply back -----------------------------------------------

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
