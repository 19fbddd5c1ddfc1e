"""Microsoft Graph's reads of Teams messages, as a bot reads its own replies back, and no more.

Only what Graph v1.0 offers, with its rules:

- `GET /v1.0/chats/{chat-id}/messages`: `$top` (at most 50), `$orderby` (`lastModifiedDateTime
  desc`, the default, or `createdDateTime desc`; nothing ascending), `$filter` on the ordering
  property only (`lastModifiedDateTime` with `gt` and `lt`, `createdDateTime` with `lt`; a
  filter on another property than the `$orderby` one is ignored, as Graph ignores it), and the
  `$skiptoken` of an `@odata.nextLink`; any other query option is a 400.
- `GET /v1.0/teams/{team-id}/channels/{channel-id}/messages/{message-id}/replies`: `$top` (at
  most 50) and `$skiptoken` only; a channel Graph does not know under that team is a 404.

Every request needs a bearer token issued for `https://graph.microsoft.com/.default` by a
tenant's token endpoint (a Bot Connector token is refused, as Graph refuses a token for
another audience): 401 `InvalidAuthenticationToken` otherwise. A personal chat is read only by
the app it is with (403: the app's resource-specific consent covers its own chats).

Messages are the posts the connector simulator took, each shown at its Graph place once
Graph's lag (`POST /sim/graph {"lag_ms"}`) has passed, as `chatMessage` resources: `id` (the
id the connector answered the post with), times, `from.application`, an HTML `body` naming its
attachments, and `attachments` whose `content` is the card as a JSON string. What Graph does
not return is not returned: no `channelData`, no request headers (the Idempotency-Key).
"""

from __future__ import annotations

import json
import re
from datetime import datetime
from typing import Any
from urllib.parse import urlencode

from simulators import connector, store
from simulators.wire import Call, HttpError, Response, _json_object, _number, _text

MAX_TOP = 50
DEFAULT_TOP = 20
_CHAT_ID = re.compile(r"19:[^/\s]+@(thread\.v2|thread\.skype|unq\.gbl\.spaces)")
_PERSONAL = re.compile(r"19:(?P<user>[^_]+)_(?P<app>[^@]+)@unq\.gbl\.spaces")
_FILTER = re.compile(
    r"(?P<prop>lastModifiedDateTime|createdDateTime) (?P<op>gt|lt) (?P<at>\S+)"
    r"(?: and (?P=prop) (?P<op2>gt|lt) (?P<at2>\S+))?"
)
_ORDERS = {
    "lastModifiedDateTime desc": "lastModifiedDateTime",
    "createdDateTime desc": "createdDateTime",
}


def _error(status: int, code: str, message: str) -> HttpError:
    """An error as Graph answers it."""
    return HttpError(status, message, payload={"error": {"code": code, "message": message}})


def _token(call: Call) -> store.BotToken:
    token = call.request.bearer_token
    found = store.valid_bot_token(call.conn, token) if token else None
    if found is None or found.scope != connector.GRAPH_SCOPE:
        raise _error(
            401,
            "InvalidAuthenticationToken",
            "Access token is empty, invalid, expired or not issued for Microsoft Graph.",
        )
    return found


def _options(call: Call, allowed: set[str]) -> dict[str, str]:
    unknown = sorted(set(call.request.query) - allowed)
    if unknown:
        raise _error(400, "BadRequest", f"Query option '{unknown[0]}' is not supported here.")
    return dict(call.request.query)


def _top(options: dict[str, str]) -> int:
    raw = options.get("$top")
    if raw is None:
        return DEFAULT_TOP
    if not (raw.isascii() and raw.isdecimal()) or not 1 <= int(raw) <= MAX_TOP:
        raise _error(400, "BadRequest", f"Invalid page size specified: '{raw}'; at most {MAX_TOP}.")
    return int(raw)


def _skip(options: dict[str, str]) -> int:
    raw = options.get("$skiptoken", "0")
    if not (raw.isascii() and raw.isdecimal()):
        raise _error(400, "BadRequest", "Invalid skip token.")
    return int(raw)


def _when(raw: str) -> datetime:
    try:
        at = datetime.fromisoformat(raw)
    except ValueError:
        raise _error(400, "BadRequest", f"Invalid filter date '{raw}'.") from None
    if at.tzinfo is None:
        raise _error(400, "BadRequest", f"Filter date '{raw}' needs a time zone (Z).")
    return at


def _window(options: dict[str, str], ordered_by: str) -> tuple[datetime | None, datetime | None]:
    """The (after, before) bounds of a `$filter` Graph applies: on the `$orderby` property
    only, given explicitly; otherwise the filter is ignored, as Graph ignores it."""
    raw = options.get("$filter")
    if raw is None or "$orderby" not in options:
        return None, None
    match = _FILTER.fullmatch(raw.strip())
    if match is None or match["prop"] != ordered_by:
        return None, None
    after = before = None
    for op, at in ((match["op"], match["at"]), (match["op2"], match["at2"])):
        if op is None:
            continue
        if op == "gt" and ordered_by == "createdDateTime":
            raise _error(400, "BadRequest", "createdDateTime supports only the 'lt' operator.")
        if op == "gt":
            after = _when(at)
        else:
            before = _when(at)
    return after, before


def _next_link(call: Call, options: dict[str, str], skip: int) -> str:
    query = urlencode({**options, "$skiptoken": str(skip)})
    return f"http://{call.request.host or '127.0.0.1'}{call.request.path}?{query}"


def _page(
    call: Call,
    options: dict[str, str],
    rows: list[store.Row],
    skip: int,
    top: int,
    where: dict[str, Any],
) -> Response:
    """One page: at most `top` messages, and a next link when more may follow."""
    more = len(rows) > top
    body: dict[str, Any] = {"@odata.count": min(len(rows), top)}
    body["value"] = [_message(r, where) for r in rows[:top]]
    if more:
        body["@odata.nextLink"] = _next_link(call, options, skip + top)
    return Response(200, body)


def chat_messages(call: Call) -> Response:
    """The messages of a chat, newest first."""
    bot = _token(call)
    chat = call.params["chat"]
    if _CHAT_ID.fullmatch(chat) is None:
        raise _error(404, "NotFound", f"Chat '{chat}' was not found.")
    personal = _PERSONAL.fullmatch(chat)
    if personal is not None and personal["app"] != bot.app_id:
        raise _error(403, "Forbidden", "Missing consent: the app is not a member of this chat.")
    options = _options(call, {"$top", "$orderby", "$filter", "$skiptoken"})
    order = options.get("$orderby", "lastModifiedDateTime desc")
    if order not in _ORDERS:
        raise _error(
            400, "BadRequest", f"$orderby '{order}' is not supported: use {' or '.join(_ORDERS)}."
        )
    after, before = _window(options, _ORDERS[order])
    top, skip = _top(options), _skip(options)
    rows = store.graph_chat_posts(
        call.conn, chat, skip=skip, top=top + 1, after=after, before=before
    )
    return _page(call, options, rows, skip, top, {"chatId": chat})


def channel_replies(call: Call) -> Response:
    """The replies to a channel message, as Graph lists them."""
    _token(call)
    team, channel, root = call.params["team"], call.params["channel"], call.params["message"]
    if store.graph_channel_team(call.conn, channel) != team:
        raise _error(404, "NotFound", f"Channel '{channel}' was not found in team '{team}'.")
    options = _options(call, {"$top", "$skiptoken"})
    top, skip = _top(options), _skip(options)
    rows = store.graph_thread_posts(call.conn, channel, root, skip=skip, top=top + 1)
    identity = {"channelIdentity": {"teamId": team, "channelId": channel}, "replyToId": root}
    return _page(call, options, rows, skip, top, identity)


def _message(row: store.Row, where: dict[str, Any]) -> dict[str, Any]:
    """A post as Graph's chatMessage."""
    activity: dict[str, Any] = row["activity"]
    at = row["created_at"].isoformat().replace("+00:00", "Z")
    attachments = []
    for i, attachment in enumerate(activity.get("attachments") or []):
        content = attachment.get("content")
        attachments.append(
            {
                "id": f"{row['id']}-{i}",
                "contentType": attachment.get("contentType"),
                "contentUrl": attachment.get("contentUrl"),
                "content": None if content is None else json.dumps(content),
                "name": attachment.get("name"),
                "thumbnailUrl": None,
                "teamsAppId": None,
            }
        )
    html = "".join(f'<attachment id="{a["id"]}"></attachment>' for a in attachments)
    sender = activity.get("from")
    name = sender.get("name") if isinstance(sender, dict) else None
    return {
        "id": str(row["id"]),
        "replyToId": None,
        "etag": str(row["id"]),
        "messageType": "message",
        "createdDateTime": at,
        "lastModifiedDateTime": at,
        "lastEditedDateTime": None,
        "deletedDateTime": None,
        "subject": None,
        "summary": None,
        "importance": "normal",
        "locale": "en-us",
        "webUrl": None,
        "chatId": None,
        "channelIdentity": None,
        "from": {
            "user": None,
            "device": None,
            "application": {
                "@odata.type": "#microsoft.graph.teamworkApplicationIdentity",
                "id": row["app_id"],
                "displayName": name,
                "applicationIdentityType": "bot",
            },
        },
        "body": {"contentType": "html", "content": f"{activity.get('text') or ''}{html}"},
        "attachments": attachments,
        "mentions": [],
        "reactions": [],
        **where,
    }


def set_lag(call: Call) -> Response:
    """Set Graph's lag: how long after a post it first shows (for posts from now on)."""
    lag_ms = int(_number(_json_object(call.request), "lag_ms", 0, 0, 600_000))
    store.set_graph_lag(call.conn, lag_ms)
    return Response(200, {"lag_ms": lag_ms})


def register_channel(call: Call) -> Response:
    """Make a team's channel known to Graph (its replies are read under the team's id)."""
    body = _json_object(call.request)
    team, channel = _text(body, "team_id"), _text(body, "channel_id")
    store.upsert_graph_channel(call.conn, team, channel)
    return Response(201, {"team_id": team, "channel_id": channel})
