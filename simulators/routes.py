"""Request parsing, routing and endpoint logic of the vendor simulators (no sockets here).

Endpoints run inside the caller's transaction and a savepoint: an error answer leaves no effect.
"""

from __future__ import annotations

import hashlib
import re
from urllib.parse import unquote

from sqlalchemy import Connection

from simulators import a2a_agent, connector, graph, model, rate_limit, store
from simulators.wire import (
    _MAX_BIGINT,
    DEFAULT_FINE_TUNE_DURATION_S,
    DEFAULT_NOTIFY_DEDUPE_S,
    DEFAULT_PAGE_SIZE,
    DEFAULT_SOURCE_DOCS,
    MAX_DELAY_MS,
    MAX_FINE_TUNE_DURATION_S,
    MAX_PAGE_SIZE,
    Call,
    Handler,
    HttpError,
    Request,
    Response,
    _int_query,
    _json_object,
    _number,
    _optional_text,
    _query,
    _text,
)


def respond(
    conn: Connection,
    request: Request,
    incident_dedupe_s: float,
    notify_dedupe_s: float = DEFAULT_NOTIFY_DEDUPE_S,
    source_docs: int = DEFAULT_SOURCE_DOCS,
) -> Response:
    """Answer ``request``: request errors, then injected faults, then the endpoint (atomically)."""
    if request.error is not None:
        return request.error.response()
    if request.fail_status is not None:
        return Response(request.fail_status, {"error": "injected failure (X-Sim-Fail)"})
    fault = None if request.path.startswith("/sim/") else store.take_fault(conn, request)
    if fault is not None and not fault.after:
        return Response(fault.status, {"error": "injected failure (sim fault)"})
    try:
        handler, params = _route(request)
        with conn.begin_nested():
            call = Call(conn, request, params, incident_dedupe_s, notify_dedupe_s, source_docs)
            response = handler(call)
    except HttpError as exc:
        return exc.response()
    if fault is not None:
        # The request took effect; its answer is lost (a 5xx, or a hang past the caller's
        # timeout): the caller cannot tell whether it landed.
        return Response(
            fault.status, {"error": "injected failure after the effect"}, delay_ms=fault.delay_ms
        )
    return response


def add_fault(call: Call) -> Response:
    """Arm a fault: the next `times` requests matching `method` and `path` (a prefix) answer
    `status`, before their effect (`after: false`) or after it (`after: true`, optionally
    after `delay_ms`, to stand for an answer lost in flight)."""
    body = _json_object(call.request)
    fault = store.Fault(
        method=_text(body, "method"),
        path=_text(body, "path"),
        status=int(_number(body, "status", 503, 200, 599)),
        times=int(_number(body, "times", 1, 1, 1_000_000)),
        after=bool(body.get("after", False)),
        delay_ms=int(_number(body, "delay_ms", 0, 0, MAX_DELAY_MS)),
        run_id=_optional_text(body, "run_id"),
    )
    return Response(201, {"id": store.insert_fault(call.conn, fault)})


def _route(request: Request) -> tuple[Handler, dict[str, str]]:
    """The handler for the request's method and path; 404 or 405 when there is none."""
    allowed: list[str] = []
    for method, pattern, handler in ROUTES:
        match = pattern.fullmatch(request.path)
        if match is None:
            continue
        if method == request.method:
            return handler, {k: unquote(v) for k, v in match.groupdict().items()}
        allowed.append(method)
    if allowed:
        message = f"method {request.method} not allowed on {request.path}"
        # The Bot Connector's own words for a method it does not serve (GET .../activities).
        payload = (
            {"message": f"The requested resource does not support http method '{request.method}'."}
            if request.vendor == "connector"
            else None
        )
        raise HttpError(405, message, {"Allow": ", ".join(sorted(set(allowed)))}, payload)
    raise HttpError(404, f"no such path: {request.path}")


def _incident_id(call: Call) -> int:
    """The incident id path parameter as an int; 404 when it cannot be an incident id."""
    raw = call.params["incident"]
    if not raw.isdecimal() or int(raw) > _MAX_BIGINT:
        raise HttpError(404, f"incident {raw} not found")
    return int(raw)


def healthz(call: Call) -> Response:
    """Liveness: the server answers and could write its request record."""
    return Response(200, {"ok": True})


def get_ticket(call: Call) -> Response:
    """A deterministic ticket: a read with no effect."""
    ticket = call.params["ticket"]
    return Response(
        200, {"id": ticket, "title": f"Ticket {ticket}", "status": "open", "priority": "p2"}
    )


def create_incident(call: Call) -> Response:
    """Open an incident; a key seen within the dedupe window replays the first incident (200)."""
    body = _json_object(call.request)
    title, severity = _text(body, "title"), _text(body, "severity", default="sev3")
    key = call.request.idem_key
    if key is not None:
        store.lock_idem_key(call.conn, "incidents", key)
        existing = store.recent_incident(call.conn, key, call.incident_dedupe_s)
        if existing is not None:
            return Response(200, existing, deduped=True)
    return Response(201, store.insert_incident(call.conn, title, severity, key))


def list_incidents(call: Call) -> Response:
    """Incidents with the ``key`` query parameter as idempotency key (all without it)."""
    return Response(200, store.incidents(call.conn, _query(call, "key")))


def get_incident(call: Call) -> Response:
    """One incident with its updates, or 404."""
    incident_id = _incident_id(call)
    found = store.incident(call.conn, incident_id)
    if found is None:
        raise HttpError(404, f"incident {incident_id} not found")
    return Response(200, {**found, "updates": store.incident_updates(call.conn, incident_id)})


def create_incident_update(call: Call) -> Response:
    """Add an update to an incident, deduplicated per incident and key like incident creation."""
    incident_id = _incident_id(call)
    if store.incident(call.conn, incident_id) is None:
        raise HttpError(404, f"incident {incident_id} not found")
    text = _text(_json_object(call.request), "body")
    key = call.request.idem_key
    if key is not None:
        store.lock_idem_key(call.conn, "incident_updates", key)
        existing = store.recent_incident_update(call.conn, incident_id, key, call.incident_dedupe_s)
        if existing is not None:
            return Response(200, existing, deduped=True)
    return Response(201, store.insert_incident_update(call.conn, incident_id, text, key))


def create_comment(call: Call) -> Response:
    """Comment on an issue; never deduplicated, the key is only stored for readers."""
    text = _text(_json_object(call.request), "body")
    row = store.insert_comment(call.conn, call.params["issue"], text, call.request.idem_key)
    return Response(201, row)


def list_comments_by_key(call: Call) -> Response:
    """Comments written with the ``key`` query parameter: how a reader finds its own write."""
    key = _query(call, "key")
    if key is None:
        raise HttpError(400, "query parameter 'key' is required")
    return Response(200, store.comments(call.conn, key=key))


def list_issue_comments(call: Call) -> Response:
    """All comments of one issue."""
    return Response(200, store.comments(call.conn, issue=call.params["issue"]))


def create_chat_reply(call: Call) -> Response:
    """Post a chat reply with optional cards; never deduplicated."""
    body = _json_object(call.request)
    conversation, reply = _text(body, "conversation"), _text(body, "text")
    cards = body.get("cards")
    cards = [] if cards is None else cards
    if not isinstance(cards, list):
        raise HttpError(400, "field 'cards' must be a list")
    key = call.request.idem_key
    return Response(201, store.insert_chat_reply(call.conn, conversation, reply, cards, key))


def list_chat_replies(call: Call) -> Response:
    """Chat replies by ``conversation`` and/or ``key`` query parameters (one is required)."""
    conversation, key = _query(call, "conversation"), _query(call, "key")
    if conversation is None and key is None:
        raise HttpError(400, "query parameter 'conversation' or 'key' is required")
    return Response(200, store.chat_replies(call.conn, conversation=conversation, key=key))


def create_notification(call: Call) -> Response:
    """Send a notification; a key seen within the short dedupe window replays it (200)."""
    body = _json_object(call.request)
    channel, message = _text(body, "channel"), _text(body, "text")
    key = call.request.idem_key
    if key is not None:
        store.lock_idem_key(call.conn, "notify", key)
        existing = store.recent_notification(call.conn, key, call.notify_dedupe_s)
        if existing is not None:
            return Response(200, existing, deduped=True)
    return Response(201, store.insert_notification(call.conn, channel, message, key))


def list_notifications(call: Call) -> Response:
    """Notifications by ``channel`` and/or ``key`` query parameters (one is required)."""
    channel, key = _query(call, "channel"), _query(call, "key")
    if channel is None and key is None:
        raise HttpError(400, "query parameter 'channel' or 'key' is required")
    return Response(200, store.notifications(call.conn, channel=channel, key=key))


def create_fine_tune(call: Call) -> Response:
    """Start a fine-tune job; a key seen within the (long) incident window replays it (200)."""
    body = _json_object(call.request)
    model, dataset = _text(body, "model"), _text(body, "dataset")
    duration_s = _number(
        body, "duration_s", DEFAULT_FINE_TUNE_DURATION_S, 0.0, MAX_FINE_TUNE_DURATION_S
    )
    key = call.request.idem_key
    if key is not None:
        store.lock_idem_key(call.conn, "fine_tunes", key)
        existing = store.recent_fine_tune(call.conn, key, call.incident_dedupe_s)
        if existing is not None:
            return Response(200, existing, deduped=True)
    return Response(201, store.insert_fine_tune(call.conn, model, dataset, duration_s, key))


def get_fine_tune(call: Call) -> Response:
    """A fine-tune job's status (``running`` until its duration has passed), or 404."""
    job_id = call.params["job"]
    found = store.fine_tune(call.conn, job_id)
    if found is None:
        raise HttpError(404, f"fine-tune {job_id} not found")
    return Response(200, found)


def source_doc(index: int) -> dict[str, str]:
    """Document ``index`` of the source corpus: id, title and content all follow from the index."""
    doc_id = f"doc-{index:04d}"
    digest = hashlib.sha256(doc_id.encode()).hexdigest()
    content = (
        f"Document {index} of the simulated source. "
        f"It covers topic {digest[:8]} and cites reference {digest[8:20]}."
    )
    return {"id": doc_id, "title": f"Document {index}", "content": content}


def list_source_docs(call: Call) -> Response:
    """One page of the deterministic corpus; ``next`` is the following page, null on the last."""
    page = _int_query(call, "page", 0, 0)
    size = _int_query(call, "size", DEFAULT_PAGE_SIZE, 1, MAX_PAGE_SIZE)
    start = page * size
    docs = [source_doc(i) for i in range(start, min(start + size, call.source_docs))]
    more = start + size < call.source_docs
    return Response(200, {"docs": docs, "next": page + 1 if more else None})


_SEGMENT = r"[^/]+"
ROUTES: tuple[tuple[str, re.Pattern[str], Handler], ...] = tuple(
    (method, re.compile(pattern.replace("{", "(?P<").replace("}", f">{_SEGMENT})")), handler)
    for method, pattern, handler in (
        ("GET", "/healthz", healthz),
        ("GET", "/tickets/{ticket}", get_ticket),
        ("POST", "/incidents", create_incident),
        ("GET", "/incidents", list_incidents),
        ("GET", "/incidents/{incident}", get_incident),
        ("POST", "/incidents/{incident}/updates", create_incident_update),
        ("POST", "/issues/{issue}/comments", create_comment),
        ("GET", "/issues/{issue}/comments", list_issue_comments),
        ("GET", "/comments", list_comments_by_key),
        ("POST", "/chat/replies", create_chat_reply),
        ("GET", "/chat/replies", list_chat_replies),
        ("POST", "/notify", create_notification),
        ("GET", "/notify", list_notifications),
        ("POST", "/a2a", a2a_agent.rpc),
        ("GET", "/a2a/.well-known/agent-card.json", a2a_agent.agent_card),
        (
            "POST",
            "/v3/conversations/{conversation}/activities/{activity}",
            connector.reply_to_activity,
        ),
        ("POST", "/v3/conversations/{conversation}/activities", connector.send_to_conversation),
        ("GET", "/v3/teams/{team}", connector.team_details),
        ("POST", "/botframework.com/oauth2/v2.0/token", connector.issue_token),
        (
            "POST",
            "/login.microsoftonline.com/{tenant}/oauth2/v2.0/token",
            connector.issue_tenant_token,
        ),
        ("GET", "/v1.0/chats/{chat}/messages", graph.chat_messages),
        (
            "GET",
            "/v1.0/teams/{team}/channels/{channel}/messages/{message}/replies",
            graph.channel_replies,
        ),
        ("GET", "/v1.0/users/{user}/teamwork/installedApps", graph.installed_apps),
        (
            "GET",
            "/v1.0/users/{user}/teamwork/installedApps/{installation}/chat",
            graph.installed_app_chat,
        ),
        ("POST", "/sim/graph", graph.set_lag),
        ("POST", "/sim/teams", connector.register_team),
        ("POST", "/sim/teams/personal", graph.install_personal),
        ("POST", "/sim/graph/channels", graph.register_channel),
        ("POST", "/sim/bots", connector.register_bot),
        ("POST", "/sim/bots/{app}/revoke", connector.revoke_tokens),
        ("POST", "/fine_tunes", create_fine_tune),
        ("GET", "/fine_tunes/{job}", get_fine_tune),
        ("GET", "/source/docs", list_source_docs),
        ("POST", "/v1/scripts", model.save_script),
        ("POST", "/sim/faults", add_fault),
        ("POST", "/v1/chat/completions", model.chat_completions),
        ("POST", "/sim/model/limit", rate_limit.set_limit),
        ("DELETE", "/sim/model/limit", rate_limit.lift_limit),
    )
)
