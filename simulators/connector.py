"""The Bot Connector (the service at a Teams activity's `serviceUrl`) as a bot replies to it.

`POST /v3/conversations/{conversationId}/activities/{activityId}` replies to an activity and
`POST /v3/conversations/{conversationId}/activities` sends to the conversation, as the Bot
Connector REST API has them: an activity of type `message` with text and/or attachments (each
with a `contentType`), answered `201 {"id": ...}`. Never deduplicated: a reply posted twice is
two rows, which is what the judge counts.

The real connector lists nothing: `GET .../activities` is answered 405 (`Allow: POST`), as
Microsoft's is, so a poster finds its own reply again only through what Microsoft Graph shows
(`simulators/graph.py`): each post is kept with the Graph place Teams shows it at (a group chat
`19:...@thread.v2` under its own id, a channel thread `19:...;messageid=R` as the replies of
message R, a personal chat `a:...` as the one-on-one chat Teams made when the app was installed
for the person, whose Graph id only Graph tells). The request's `Idempotency-Key` header is kept
with the post for the judge's counts only; no endpoint reads it back.

`GET /v3/teams/{teamId}` answers a team's details as the Bot Connector does for a bot installed
in it (`{"id", "name", "aadGroupId"}`, `teamId` being the id activities name the team with,
`channelData.team.id`): the one way a bot learns the Microsoft 365 group id Graph names the team
by, which Teams sends in `conversationUpdate` events but not with messages. A team the connector
does not know is 404, one the bot is not installed in 403; `POST /sim/teams` installs a bot in a
team.

Every connector request must carry `Authorization: Bearer <token>` with a token this simulator's
token endpoint issued and that has not expired; anything else is answered 401 and has no
effect, as a real tenant refuses an unauthenticated bot. The token endpoint stands in for
Microsoft's (`POST /botframework.com/oauth2/v2.0/token`, OAuth 2.0 client credentials, a form
body with `grant_type=client_credentials`, `client_id`, `client_secret` and
`scope=https://api.botframework.com/.default`; and, for Microsoft Graph, a tenant's
`POST /login.microsoftonline.com/{tenant}/oauth2/v2.0/token` with
`scope=https://graph.microsoft.com/.default`) and issues opaque tokens with an expiry
(`expires_in`), each good for its own scope only, for bots registered first with
`POST /sim/bots {"app_id", "password_sha256", "token_ttl_s"}`. `POST /sim/bots/{app}/revoke`
expires every token of a bot at once (a tenant that stops honouring them). Each post keeps the
app id and the token it came with.
"""

from __future__ import annotations

import hashlib
import hmac
import re
from typing import Any

from sqlalchemy import Connection

from simulators import bot_tokens, store, teams_store
from simulators.wire import Call, HttpError, Response, _json_object, _number, _text

# The scope a bot asks for to call the Bot Connector, and the one for Microsoft Graph.
SCOPE = "https://api.botframework.com/.default"
GRAPH_SCOPE = "https://graph.microsoft.com/.default"
_SHA256 = re.compile(r"[0-9a-f]{64}")
_DENIED = {"message": "Authorization has been denied for this request."}


def _bot(call: Call) -> bot_tokens.BotToken:
    """The bot whose valid token the request carries, or 401 (no effect)."""
    token = call.request.bearer_token
    found = bot_tokens.valid_bot_token(call.conn, token) if token else None
    if found is None or found.scope not in (None, SCOPE):  # a Graph token is not for us
        raise HttpError(
            401,
            "bearer token missing, unknown or expired",
            headers={"WWW-Authenticate": 'Bearer realm="botframework"'},
            payload=_DENIED,
        )
    return found


def _activity(call: Call) -> dict[str, Any]:
    """The posted activity, or 400 naming what is wrong with it."""
    body = _json_object(call.request)
    if body.get("type") != "message":
        raise HttpError(400, "field 'type' must be \"message\"")
    text = body.get("text")
    if text is not None and not isinstance(text, str):
        raise HttpError(400, "field 'text' must be a string")
    attachments = body.get("attachments") or []
    if not isinstance(attachments, list):
        raise HttpError(400, "field 'attachments' must be a list")
    for i, attachment in enumerate(attachments):
        if not isinstance(attachment, dict) or not isinstance(attachment.get("contentType"), str):
            raise HttpError(400, f"attachments[{i}] needs a 'contentType'")
    if not (text or "").strip() and not attachments:
        raise HttpError(400, "an activity needs 'text' or 'attachments'")
    return body


def graph_place(conn: Connection, conversation: str) -> teams_store.GraphPlace:
    """Where Teams shows a post to `conversation` in Graph: a channel thread (`19:...;messageid=
    R`: the replies of R), a group chat (`19:...@thread...`: itself), or the personal chat a
    personal conversation is (made when the app was installed for the person); nowhere when
    Teams has no such conversation."""
    base, thread, root = conversation.partition(";messageid=")
    if thread and base.startswith("19:") and root:
        return teams_store.GraphPlace(channel=base, root=root)
    if conversation.startswith("19:") and "@thread" in conversation:
        return teams_store.GraphPlace(chat=conversation)
    return teams_store.GraphPlace(chat=teams_store.personal_chat_of(conn, conversation))


def _post(call: Call, reply_to: str | None) -> Response:
    bot = _bot(call)
    activity = _activity(call)
    conversation = call.params["conversation"]
    row = store.insert_connector_activity(
        call.conn,
        conversation,
        reply_to,
        activity,
        call.request.idem_key,
        bot,
        graph_place(call.conn, conversation),
    )
    return Response(201, {"id": row["id"]})


def reply_to_activity(call: Call) -> Response:
    """Reply to an activity in its conversation."""
    return _post(call, call.params["activity"])


def send_to_conversation(call: Call) -> Response:
    """Send an activity to a conversation (its `replyToId`, if any, is kept)."""
    reply_to = _json_object(call.request).get("replyToId")
    return _post(call, reply_to if isinstance(reply_to, str) else None)


def team_details(call: Call) -> Response:
    """A team's details, for a bot installed in it: its id, name and Microsoft 365 group id."""
    bot = _bot(call)
    found = teams_store.team(call.conn, call.params["team"])
    if found is None:
        raise HttpError(
            404,
            "no such team",
            payload={"error": {"code": "NotFound", "message": "Cannot find team with provided id"}},
        )
    if found["app_id"] != bot.app_id:
        raise HttpError(
            403,
            "the bot is not in the team",
            payload={
                "error": {
                    "code": "BotNotInConversationRoster",
                    "message": "The bot is not part of the conversation roster.",
                }
            },
        )
    return Response(
        200, {"id": found["team_id"], "name": found["name"], "aadGroupId": found["aad_group_id"]}
    )


def register_team(call: Call) -> Response:
    """Install a bot in a team: the id activities name the team with, its group id, its name."""
    body = _json_object(call.request)
    team, group = _text(body, "team_id"), _text(body, "aad_group_id")
    name, app_id = _text(body, "name", default="Team"), _text(body, "app_id")
    teams_store.upsert_team(call.conn, team, group, name, app_id)
    return Response(201, {"team_id": team, "aad_group_id": group, "app_id": app_id})


def _oauth_error(status: int, code: str, description: str) -> HttpError:
    """An error as Microsoft's token endpoint answers it (RFC 6749 section 5.2)."""
    return HttpError(status, description, payload={"error": code, "error_description": description})


def issue_token(call: Call) -> Response:
    """OAuth 2.0 client credentials: a registered bot's id and password buy a bearer token
    for the Bot Connector, valid for the bot's token lifetime."""
    return _issue(call, SCOPE, None)


def issue_tenant_token(call: Call) -> Response:
    """The same flow at a tenant's endpoint, for Microsoft Graph in that tenant."""
    return _issue(call, GRAPH_SCOPE, call.params["tenant"])


def _issue(call: Call, scope: str, tenant: str | None) -> Response:
    form = call.request.form
    if form is None:
        raise _oauth_error(
            400, "invalid_request", "send a form body (application/x-www-form-urlencoded)"
        )
    if form.get("grant_type") != "client_credentials":
        raise _oauth_error(400, "unsupported_grant_type", "grant_type must be client_credentials")
    if form.get("scope") != scope:
        raise _oauth_error(400, "invalid_scope", f"scope must be {scope} at this endpoint")
    app_id, secret = form.get("client_id") or "", form.get("client_secret") or ""
    found = bot_tokens.bot_password(call.conn, app_id) if app_id else None
    given = hashlib.sha256(secret.encode()).hexdigest()
    if found is None or not secret or not hmac.compare_digest(found[0], given):
        raise _oauth_error(401, "invalid_client", "unknown client_id or wrong client_secret")
    token, _ = bot_tokens.issue_bot_token(call.conn, app_id, found[1], scope, tenant)
    lifetime = round(found[1])
    return Response(
        200,
        {
            "token_type": "Bearer",
            "expires_in": lifetime,
            "ext_expires_in": lifetime,
            "access_token": token,
        },
        headers={"Cache-Control": "no-store"},
    )


def register_bot(call: Call) -> Response:
    """Register (or change) a bot the token endpoint issues tokens to."""
    body = _json_object(call.request)
    app_id = _text(body, "app_id")
    digest = _text(body, "password_sha256")
    if not _SHA256.fullmatch(digest):
        raise HttpError(400, "field 'password_sha256' must be 64 lower-case hex digits")
    ttl = _number(body, "token_ttl_s", 3600, 1, 86400)
    bot_tokens.upsert_bot(call.conn, app_id, digest, ttl)
    return Response(201, {"app_id": app_id, "token_ttl_s": ttl})


def revoke_tokens(call: Call) -> Response:
    """Expire every token of the path's bot now."""
    return Response(200, {"expired": bot_tokens.expire_bot_tokens(call.conn, call.params["app"])})
