"""The Bot Connector (the service at a Teams activity's `serviceUrl`) as a bot replies to it.

`POST /v3/conversations/{conversationId}/activities/{activityId}` replies to an activity and
`POST /v3/conversations/{conversationId}/activities` sends to the conversation, as the Bot
Connector REST API has them: an activity of type `message` with text and/or attachments (each
with a `contentType`), answered `201 {"id": ...}`. Never deduplicated: a reply posted twice is
two rows, which is what the judge counts.

How a poster finds its own reply again (an extension the real connector does not offer): the
request's `Idempotency-Key` header is kept with the post, and
`GET /v3/conversations/{conversationId}/activities?key=K` lists the posts made with key K.

Every connector request must carry `Authorization: Bearer <token>` with a token this simulator's
token endpoint issued and that has not expired; anything else is answered 401 and has no
effect, as a real tenant refuses an unauthenticated bot. The token endpoint stands in for
Microsoft's (`POST /botframework.com/oauth2/v2.0/token`, OAuth 2.0 client credentials, a form
body with `grant_type=client_credentials`, `client_id`, `client_secret` and
`scope=https://api.botframework.com/.default`) and issues opaque tokens with an expiry
(`expires_in`), for bots registered first with
`POST /sim/bots {"app_id", "password_sha256", "token_ttl_s"}`. `POST /sim/bots/{app}/revoke`
expires every token of a bot at once (a tenant that stops honouring them). Each post keeps the
app id and the token it came with.
"""

from __future__ import annotations

import hashlib
import hmac
import re
from typing import Any

from simulators import store
from simulators.wire import Call, HttpError, Response, _json_object, _number, _query, _text

# The scope a bot asks for to call the Bot Connector.
SCOPE = "https://api.botframework.com/.default"
_SHA256 = re.compile(r"[0-9a-f]{64}")
_DENIED = {"message": "Authorization has been denied for this request."}


def _bot(call: Call) -> store.BotToken:
    """The bot whose valid token the request carries, or 401 (no effect)."""
    token = call.request.bearer_token
    found = store.valid_bot_token(call.conn, token) if token else None
    if found is None:
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


def reply_to_activity(call: Call) -> Response:
    """Reply to an activity in its conversation."""
    bot = _bot(call)
    activity = _activity(call)
    row = store.insert_connector_activity(
        call.conn,
        call.params["conversation"],
        call.params["activity"],
        activity,
        call.request.idem_key,
        bot,
    )
    return Response(201, {"id": row["id"]})


def send_to_conversation(call: Call) -> Response:
    """Send an activity to a conversation (its `replyToId`, if any, is kept)."""
    bot = _bot(call)
    activity = _activity(call)
    reply_to = activity.get("replyToId")
    row = store.insert_connector_activity(
        call.conn,
        call.params["conversation"],
        reply_to if isinstance(reply_to, str) else None,
        activity,
        call.request.idem_key,
        bot,
    )
    return Response(201, {"id": row["id"]})


def list_by_key(call: Call) -> Response:
    """The posts made in a conversation with the `key` query parameter, oldest first."""
    _bot(call)
    key = _query(call, "key")
    if key is None:
        raise HttpError(400, "query parameter 'key' is required")
    rows = store.connector_activities(call.conn, conversation=call.params["conversation"], key=key)
    return Response(200, {"activities": rows})


def _oauth_error(status: int, code: str, description: str) -> HttpError:
    """An error as Microsoft's token endpoint answers it (RFC 6749 section 5.2)."""
    return HttpError(status, description, payload={"error": code, "error_description": description})


def issue_token(call: Call) -> Response:
    """OAuth 2.0 client credentials: a registered bot's id and password buy a bearer token
    for the Bot Connector, valid for the bot's token lifetime."""
    form = call.request.form
    if form is None:
        raise _oauth_error(
            400, "invalid_request", "send a form body (application/x-www-form-urlencoded)"
        )
    if form.get("grant_type") != "client_credentials":
        raise _oauth_error(400, "unsupported_grant_type", "grant_type must be client_credentials")
    if form.get("scope") != SCOPE:
        raise _oauth_error(400, "invalid_scope", f"scope must be {SCOPE}")
    app_id, secret = form.get("client_id") or "", form.get("client_secret") or ""
    found = store.bot_password(call.conn, app_id) if app_id else None
    given = hashlib.sha256(secret.encode()).hexdigest()
    if found is None or not secret or not hmac.compare_digest(found[0], given):
        raise _oauth_error(401, "invalid_client", "unknown client_id or wrong client_secret")
    token, _ = store.issue_bot_token(call.conn, app_id, found[1])
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
    store.upsert_bot(call.conn, app_id, digest, ttl)
    return Response(201, {"app_id": app_id, "token_ttl_s": ttl})


def revoke_tokens(call: Call) -> Response:
    """Expire every token of the path's bot now."""
    return Response(200, {"expired": store.expire_bot_tokens(call.conn, call.params["app"])})
