"""The Bot Connector (the service at a Teams activity's `serviceUrl`) as a bot replies to it.

`POST /v3/conversations/{conversationId}/activities/{activityId}` replies to an activity and
`POST /v3/conversations/{conversationId}/activities` sends to the conversation, as the Bot
Connector REST API has them: an activity of type `message` with text and/or attachments (each
with a `contentType`), answered `201 {"id": ...}`. Never deduplicated: a reply posted twice is
two rows, which is what the judge counts.

How a poster finds its own reply again (an extension the real connector does not offer): the
request's `Idempotency-Key` header is kept with the post, and
`GET /v3/conversations/{conversationId}/activities?key=K` lists the posts made with key K.
"""

from __future__ import annotations

from typing import Any

from simulators import store
from simulators.wire import Call, HttpError, Response, _json_object, _query


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
    activity = _activity(call)
    row = store.insert_connector_activity(
        call.conn,
        call.params["conversation"],
        call.params["activity"],
        activity,
        call.request.idem_key,
    )
    return Response(201, {"id": row["id"]})


def send_to_conversation(call: Call) -> Response:
    """Send an activity to a conversation (its `replyToId`, if any, is kept)."""
    activity = _activity(call)
    reply_to = activity.get("replyToId")
    row = store.insert_connector_activity(
        call.conn,
        call.params["conversation"],
        reply_to if isinstance(reply_to, str) else None,
        activity,
        call.request.idem_key,
    )
    return Response(201, {"id": row["id"]})


def list_by_key(call: Call) -> Response:
    """The posts made in a conversation with the `key` query parameter, oldest first."""
    key = _query(call, "key")
    if key is None:
        raise HttpError(400, "query parameter 'key' is required")
    rows = store.connector_activities(call.conn, conversation=call.params["conversation"], key=key)
    return Response(200, {"activities": rows})
