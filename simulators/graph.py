"""Microsoft Graph's reads of Teams messages, as a bot reads its own replies back, and no more.

Only what Graph v1.0 offers, with its rules:

- `GET /v1.0/chats/{chat-id}/messages`: `$top` (at most 50), `$orderby` (`lastModifiedDateTime
  desc`, the default, or `createdDateTime desc`; nothing ascending), `$filter` on the ordering
  property only (`lastModifiedDateTime` with `gt` and `lt`, `createdDateTime` with `lt`; a
  filter on another property than the `$orderby` one is ignored, as Graph ignores it), and the
  `$skiptoken` of an `@odata.nextLink`; any other query option is a 400.
- `GET /v1.0/teams/{team-id}/channels/{channel-id}/messages/{message-id}/replies`: `$top` (at
  most 50) and `$skiptoken` only; a channel Graph does not know under that team is a 404.

- `GET /v1.0/users/{user-id}/teamwork/installedApps`: the apps installed in a person's personal
  scope, `$expand` (`teamsApp`, `teamsAppDefinition`) and `$filter` on the app's catalog entry
  (`teamsApp/id eq '...'` or `teamsApp/externalId eq '...'`, the manifest id) only; each
  installation's `id` is what the next call takes.
- `GET /v1.0/users/{user-id}/teamwork/installedApps/{app-installation-id}/chat`: the one-on-one
  chat between the person and the app (a `chat`, its `id` the chat's Graph id): the documented
  way to the Graph id of a bot's personal chat with someone, which Teams generates and nothing
  in an activity names.

Every request needs a bearer token issued for `https://graph.microsoft.com/.default` by a
tenant's token endpoint (a Bot Connector token is refused, as Graph refuses a token for
another audience): 401 `InvalidAuthenticationToken` otherwise; a person's installations are
those in the token's tenant. A personal chat is read only by the app it is with (403: the app's
resource-specific consent covers its own chats); a team is named by its group id, a GUID (400
otherwise, as Graph answers `teamId needs to be a valid GUID`).

Messages are the posts the connector simulator took, each shown at its Graph place once
Graph's lag (`POST /sim/graph {"lag_ms"}`) has passed, as `chatMessage` resources: `id` (the
id the connector answered the post with), times, `from.application`, an HTML `body` naming its
attachments, and `attachments` whose `content` is the card as a JSON string. What Graph does
not return is not returned: no `channelData`, no request headers (the Idempotency-Key).
"""

from __future__ import annotations

import base64
import json
import re
from datetime import datetime
from typing import Any
from urllib.parse import urlencode

from simulators import connector, teams_store
from simulators.bot_tokens import BotToken, valid_bot_token
from simulators.wire import (
    Call,
    HttpError,
    Response,
    _json_object,
    _number,
    _optional_text,
    _text,
)

MAX_TOP = 50
DEFAULT_TOP = 20
_CHAT_ID = re.compile(r"19:[^/\s]+@(thread\.v2|thread\.skype|unq\.gbl\.spaces)")
_GUID = re.compile(r"[0-9a-fA-F]{8}-(?:[0-9a-fA-F]{4}-){3}[0-9a-fA-F]{12}")
_APP_FILTER = re.compile(r"teamsApp/(?P<field>id|externalId) eq '(?P<value>[^']*)'")
_EXPANDS = frozenset({"teamsApp", "teamsAppDefinition"})
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


def _token(call: Call) -> BotToken:
    token = call.request.bearer_token
    found = valid_bot_token(call.conn, token) if token else None
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
    rows: list[teams_store.Row],
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
    if chat.endswith("@unq.gbl.spaces"):
        with_bot = teams_store.personal_chat_bot(call.conn, chat)
        if with_bot is None:
            raise _error(404, "NotFound", f"Chat '{chat}' was not found.")
        if with_bot != bot.app_id:
            raise _error(403, "Forbidden", "Missing consent: the app is not a member of this chat.")
    options = _options(call, {"$top", "$orderby", "$filter", "$skiptoken"})
    order = options.get("$orderby", "lastModifiedDateTime desc")
    if order not in _ORDERS:
        raise _error(
            400, "BadRequest", f"$orderby '{order}' is not supported: use {' or '.join(_ORDERS)}."
        )
    after, before = _window(options, _ORDERS[order])
    top, skip = _top(options), _skip(options)
    rows = teams_store.graph_chat_posts(
        call.conn, chat, skip=skip, top=top + 1, after=after, before=before
    )
    return _page(call, options, rows, skip, top, {"chatId": chat})


def channel_replies(call: Call) -> Response:
    """The replies to a channel message, as Graph lists them."""
    _token(call)
    team, channel, root = call.params["team"], call.params["channel"], call.params["message"]
    if _GUID.fullmatch(team) is None:
        raise _error(400, "BadRequest", "teamId needs to be a valid GUID.")
    if teams_store.graph_channel_team(call.conn, channel) != team:
        raise _error(404, "NotFound", f"Channel '{channel}' was not found in team '{team}'.")
    options = _options(call, {"$top", "$skiptoken"})
    top, skip = _top(options), _skip(options)
    rows = teams_store.graph_thread_posts(call.conn, channel, root, skip=skip, top=top + 1)
    identity = {"channelIdentity": {"teamId": team, "channelId": channel}, "replyToId": root}
    return _page(call, options, rows, skip, top, identity)


def _message(row: teams_store.Row, where: dict[str, Any]) -> dict[str, Any]:
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
    teams_store.set_graph_lag(call.conn, lag_ms)
    return Response(200, {"lag_ms": lag_ms})


def register_channel(call: Call) -> Response:
    """Make a team's channel known to Graph (its replies are read under the team's id)."""
    body = _json_object(call.request)
    team, channel = _text(body, "team_id"), _text(body, "channel_id")
    teams_store.upsert_graph_channel(call.conn, team, channel)
    return Response(201, {"team_id": team, "channel_id": channel})


def installed_apps(call: Call) -> Response:
    """The apps installed in a person's personal scope (in the token's tenant)."""
    bot = _token(call)
    user = call.params["user"]
    options = _options(call, {"$expand", "$filter"})
    expand = {e.strip() for e in options.get("$expand", "").split(",") if e.strip()}
    if expand - _EXPANDS:
        unknown = sorted(expand - _EXPANDS)[0]
        raise _error(400, "BadRequest", f"Could not find a property named '{unknown}'.")
    field = value = None
    if "$filter" in options:
        match = _APP_FILTER.fullmatch(options["$filter"].strip())
        if match is None:
            raise _error(400, "BadRequest", "Invalid filter clause.")
        field, value = match["field"], match["value"]
    rows = teams_store.personal_installs(call.conn, user, bot.tenant, field, value)
    context = f"{_base(call)}/$metadata#users('{user}')/teamwork/installedApps"
    return Response(200, {"@odata.context": context, "value": [_install(r, expand) for r in rows]})


def _install(row: teams_store.Row, expand: set[str]) -> dict[str, Any]:
    """An installation as Graph's userScopeTeamsAppInstallation, with what was expanded."""
    found: dict[str, Any] = {"id": row["id"]}
    if "teamsApp" in expand:
        found["teamsApp"] = {
            "id": row["app_id"],
            "externalId": row["external_id"],
            "displayName": row["display_name"],
            "distributionMethod": row["distribution_method"],
        }
    if "teamsAppDefinition" in expand:
        found["teamsAppDefinition"] = {
            "id": base64.b64encode(f"{row['app_id']}##1.0.0".encode()).decode(),
            "teamsAppId": row["app_id"],
            "displayName": row["display_name"],
            "version": "1.0.0",
        }
    return found


def installed_app_chat(call: Call) -> Response:
    """The one-on-one chat between a person and an app installed for them."""
    bot = _token(call)
    _options(call, set())
    user, installation = call.params["user"], call.params["installation"]
    row = teams_store.personal_install(call.conn, installation)
    if row is None or row["user_id"] != user or row["tenant_id"] != bot.tenant:
        raise _error(404, "NotFound", f"Installation '{installation}' was not found for the user.")
    at = row["created_at"].isoformat().replace("+00:00", "Z")
    chat = row["chat_id"]
    return Response(
        200,
        {
            "@odata.context": f"{_base(call)}/$metadata#chats/$entity",
            "id": chat,
            "topic": None,
            "createdDateTime": at,
            "lastUpdatedDateTime": at,
            "chatType": "oneOnOne",
            "webUrl": f"https://teams.microsoft.com/l/chat/{chat}/0?tenantId={row['tenant_id']}",
            "tenantId": row["tenant_id"],
        },
    )


def _base(call: Call) -> str:
    return f"http://{call.request.host or '127.0.0.1'}/v1.0"


def install_personal(call: Call) -> Response:
    """Install an app in a person's personal scope (Teams makes their one-on-one chat then, with
    an id of its own) and name the Bot Framework conversation that chat is."""
    body = _json_object(call.request)
    how = _text(body, "distribution_method", default="organization")
    if how not in ("organization", "sideloaded", "store"):
        raise HttpError(400, "'distribution_method' must be organization, sideloaded or store")
    install = teams_store.PersonalInstall(
        user_id=_text(body, "user_id"),
        bot_id=_text(body, "app_id"),
        manifest_id=_text(body, "manifest_id"),
        conversation_id=_text(body, "conversation_id"),
        tenant_id=_optional_text(body, "tenant_id"),
        distribution_method=how,
    )
    teams_store.install_personal(call.conn, install)
    return Response(201, {"installed": True})
