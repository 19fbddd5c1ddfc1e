"""Request parsing, routing and endpoint logic of the vendor simulators (no sockets here).

Endpoints run inside the caller's transaction and a savepoint: an error answer leaves no effect.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

from sqlalchemy import Connection

from simulators import store

MAX_DELAY_MS = 600_000
DEFAULT_NOTIFY_DEDUPE_S = 300.0
DEFAULT_SOURCE_DOCS = 25
DEFAULT_FINE_TUNE_DURATION_S = 2.0
MAX_FINE_TUNE_DURATION_S = 3600.0
DEFAULT_PAGE_SIZE = 10
MAX_PAGE_SIZE = 100
_MAX_BIGINT = 2**63 - 1
_VENDORS: Mapping[str, str] = {
    "incidents": "incidents",
    "issues": "issues",
    "comments": "issues",
    "chat": "chat",
    "tickets": "tickets",
    "notify": "notify",
    "a2a": "a2a",
    "fine_tunes": "finetune",
    "source": "source",
}


@dataclass(frozen=True)
class Response:
    """What the simulator answers: status, JSON payload, and whether it replayed a dedupe."""

    status: int
    payload: Any
    deduped: bool = False
    headers: Mapping[str, str] = field(default_factory=dict)


class HttpError(Exception):
    """An error answer raised by endpoint code; its message names the offending field."""

    def __init__(self, status: int, message: str, headers: Mapping[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.headers = dict(headers or {})

    def response(self) -> Response:
        """The JSON error answer for this error."""
        return Response(self.status, {"error": self.message}, headers=self.headers)


@dataclass(frozen=True)
class Request:
    """A parsed HTTP request: what endpoints need and what the request record stores."""

    method: str
    target: str
    path: str
    query: Mapping[str, str]
    body: Any
    body_error: str | None
    idem_key: str | None
    run_id: str | None
    attempt: int | None
    delay_ms: int
    fail_status: int | None
    error: HttpError | None

    @property
    def vendor(self) -> str:
        """The vendor a path belongs to; ``sim`` for the health check and unknown paths."""
        return _VENDORS.get(self.path.strip("/").split("/", 1)[0], "sim")


def parse_body(raw: bytes) -> tuple[Any, str | None]:
    """Decode a JSON body; for bad input return the raw text (to record) and why it is bad."""
    if not raw:
        return None, None
    try:
        decoded = raw.decode("utf-8")
    except UnicodeDecodeError:
        return raw.decode("utf-8", "replace"), "request body is not valid UTF-8"
    try:
        return json.loads(decoded, parse_constant=_reject_constant, parse_float=_finite_float), None
    except (ValueError, RecursionError) as exc:
        return decoded, f"request body is not valid JSON: {exc}"


def _reject_constant(name: str) -> Any:
    """Refuse NaN and Infinity, which are not JSON and which jsonb cannot hold."""
    raise ValueError(f"{name} is not valid JSON")


def _finite_float(literal: str) -> float:
    """A JSON number as a float; one too large for a float (``1e400``) is refused, not infinite."""
    value = float(literal)
    if not math.isfinite(value):
        raise ValueError(f"number {literal} is out of range")
    return value


def _int_header(headers: Mapping[str, str], name: str, low: int, high: int) -> int | None:
    """An integer header within [low, high], None if absent; ValueError names the header."""
    raw = headers.get(name.lower())
    if raw is None or not raw.strip():
        return None
    try:
        value = int(raw.strip())
    except ValueError:
        raise ValueError(f"header {name} must be an integer") from None
    if not low <= value <= high:
        raise ValueError(f"header {name} must be between {low} and {high}")
    return value


def parse_request(
    method: str,
    target: str,
    headers: Mapping[str, str],
    raw_body: bytes,
    transport_error: HttpError | None = None,
) -> Request:
    """Build a Request from the wire parts; ``headers`` has lower-case names."""
    split = urlsplit(target)
    query = {k: v[-1] for k, v in parse_qs(split.query, keep_blank_values=True).items()}
    body, body_error = parse_body(raw_body)
    error: HttpError | None = transport_error
    ints: dict[str, int | None] = {}
    for name, low, high in (
        ("X-Liyagent-Attempt", -(2**31), 2**31 - 1),
        ("X-Sim-Delay-Ms", 0, MAX_DELAY_MS),
        ("X-Sim-Fail", 400, 599),
    ):
        try:
            ints[name] = _int_header(headers, name, low, high)
        except ValueError as exc:
            ints[name] = None
            error = error or HttpError(400, str(exc))
    return Request(
        method=method,
        target=target,
        path=split.path.rstrip("/") or "/",
        query=query,
        body=body,
        body_error=body_error,
        idem_key=headers.get("idempotency-key") or None,
        run_id=headers.get("x-liyagent-run") or None,
        attempt=ints["X-Liyagent-Attempt"],
        delay_ms=ints["X-Sim-Delay-Ms"] or 0,
        fail_status=ints["X-Sim-Fail"],
        error=error,
    )


def record_of(request: Request, response: Response) -> store.RequestRecord:
    """The request record for one answered request."""
    return store.RequestRecord(
        vendor=request.vendor,
        method=request.method,
        path=request.target,
        idem_key=request.idem_key,
        run_id=request.run_id,
        attempt=request.attempt,
        body=request.body,
        status=response.status,
        deduped=response.deduped,
    )


@dataclass(frozen=True)
class Call:
    """One endpoint invocation: the open transaction, the request, path parameters, windows."""

    conn: Connection
    request: Request
    params: Mapping[str, str]
    incident_dedupe_s: float
    notify_dedupe_s: float = DEFAULT_NOTIFY_DEDUPE_S
    source_docs: int = DEFAULT_SOURCE_DOCS


Handler = Callable[[Call], Response]


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
    try:
        handler, params = _route(request)
        with conn.begin_nested():
            call = Call(conn, request, params, incident_dedupe_s, notify_dedupe_s, source_docs)
            return handler(call)
    except HttpError as exc:
        return exc.response()


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
        raise HttpError(405, message, {"Allow": ", ".join(sorted(set(allowed)))})
    raise HttpError(404, f"no such path: {request.path}")


def _json_object(request: Request) -> dict[str, Any]:
    """The request body as a JSON object, or 400."""
    if request.body_error is not None:
        raise HttpError(400, request.body_error)
    if not isinstance(request.body, dict):
        raise HttpError(400, "request body must be a JSON object")
    return request.body


def _text(body: Mapping[str, Any], name: str, default: str | None = None) -> str:
    """A non-empty string field of ``body`` (``default`` when absent or null), or 400."""
    value = body.get(name)
    if value is None and default is not None:
        return default
    if value is None:
        raise HttpError(400, f"field '{name}' is required")
    if not isinstance(value, str):
        raise HttpError(400, f"field '{name}' must be a string")
    if not value.strip():
        raise HttpError(400, f"field '{name}' must not be empty")
    if "\x00" in value:
        raise HttpError(400, f"field '{name}' must not contain NUL characters")
    return value


def _optional_text(body: Mapping[str, Any], name: str) -> str | None:
    """A string field of ``body`` that may be absent or null (None), else as ``_text``."""
    return None if body.get(name) is None else _text(body, name)


def _query(call: Call, name: str) -> str | None:
    """A query parameter, None when absent."""
    return call.request.query.get(name)


def _number(body: Mapping[str, Any], name: str, default: float, low: float, high: float) -> float:
    """A number field of ``body`` within [low, high] (``default`` when absent or null), or 400."""
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise HttpError(400, f"field '{name}' must be a number")
    if not low <= value <= high:
        raise HttpError(400, f"field '{name}' must be between {low:g} and {high:g}")
    return float(value)


def _int_query(call: Call, name: str, default: int, low: int, high: int | None = None) -> int:
    """An integer query parameter within [low, high] (``default`` when absent), or 400."""
    raw = _query(call, name)
    if raw is None:
        return default
    bounds = f">= {low}" if high is None else f"between {low} and {high}"
    if not (raw.isascii() and raw.isdecimal() and len(raw) <= 18):
        raise HttpError(400, f"query parameter '{name}' must be an integer {bounds}")
    value = int(raw)
    if value < low or (high is not None and value > high):
        raise HttpError(400, f"query parameter '{name}' must be an integer {bounds}")
    return value


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


def create_a2a_task(call: Call) -> Response:
    """Hand a task to the remote agent, which completes it at once; never deduplicated."""
    body = _json_object(call.request)
    task_id, message = _text(body, "id"), _text(body, "message")
    agent = _optional_text(body, "agent")
    answer = f"{agent or 'remote-agent'} handled: {message}"
    return Response(201, store.insert_a2a_task(call.conn, task_id, agent, message, answer))


def get_a2a_task(call: Call) -> Response:
    """The first task created with the path's task id, or 404."""
    task_id = call.params["task"]
    found = store.a2a_task(call.conn, task_id)
    if found is None:
        raise HttpError(404, f"task {task_id} not found")
    return Response(200, found)


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
        ("POST", "/a2a/tasks", create_a2a_task),
        ("GET", "/a2a/tasks/{task}", get_a2a_task),
        ("POST", "/fine_tunes", create_fine_tune),
        ("GET", "/fine_tunes/{job}", get_fine_tune),
        ("GET", "/source/docs", list_source_docs),
    )
)
