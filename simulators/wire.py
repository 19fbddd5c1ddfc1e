"""The simulators' wire types: a parsed request, an answer, an error answer, and the field
readers every endpoint shares (no sockets and no routes here)."""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, parse_qsl, urlsplit

from sqlalchemy import Connection

from simulators import records

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
    "v1": "model",
    "v3": "connector",
    "botframework.com": "login",
    "login.microsoftonline.com": "login",
    "v1.0": "graph",
}
# Form fields that are credentials: kept from the request record (the endpoint still sees them).
_SECRET_FIELDS = frozenset({"client_secret", "password", "client_assertion"})


@dataclass(frozen=True)
class Response:
    """What the simulator answers: status, JSON payload, and whether it replayed a dedupe."""

    status: int
    payload: Any
    deduped: bool = False
    headers: Mapping[str, str] = field(default_factory=dict)
    # A pause before the answer is sent (after it is recorded): a model's generation time.
    delay_ms: int = 0


class HttpError(Exception):
    """An error answer raised by endpoint code; its message names the offending field."""

    def __init__(
        self,
        status: int,
        message: str,
        headers: Mapping[str, str] | None = None,
        payload: Any = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.headers = dict(headers or {})
        # The answer's body when a vendor's own error shape is wanted (default {"error": ...}).
        self.payload = payload

    def response(self) -> Response:
        """The JSON error answer for this error."""
        body = self.payload if self.payload is not None else {"error": self.message}
        return Response(self.status, body, headers=self.headers)


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
    # The call site (X-Liyagent-Call, or the model step asked for, X-Liyagent-Step).
    call: str | None = None
    # Whether an `Authorization: Bearer ...` header came (its value is never kept).
    bearer: bool = False
    # The Host header (a card names the URL it was asked on).
    host: str | None = None
    # The bearer token itself, for endpoints that check it (never recorded).
    bearer_token: str | None = None
    # A form body (application/x-www-form-urlencoded) with its credentials, for the endpoint
    # (the record keeps `body`, where the credentials are masked).
    form: Mapping[str, str] | None = None

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


def parse_form(raw: bytes) -> tuple[dict[str, str] | None, str | None]:
    """Decode a form body (its last value per name); None and why when it is not one."""
    try:
        pairs = parse_qsl(raw.decode("utf-8"), keep_blank_values=True, strict_parsing=bool(raw))
    except (UnicodeDecodeError, ValueError) as exc:
        return None, f"request body is not a valid form: {exc}"
    return dict(pairs), None


def _masked(form: Mapping[str, str]) -> dict[str, str]:
    return {k: "(masked)" if k in _SECRET_FIELDS else v for k, v in form.items()}


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
    form: dict[str, str] | None = None
    content_type = headers.get("content-type", "").split(";")[0].strip().lower()
    if content_type == "application/x-www-form-urlencoded":
        form, body_error = parse_form(raw_body)
        body: Any = None if form is None else _masked(form)
    else:
        body, body_error = parse_body(raw_body)
    error: HttpError | None = transport_error
    scheme, _, credential = headers.get("authorization", "").partition(" ")
    bearer = (credential.strip() or None) if scheme.lower() == "bearer" else None
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
        call=headers.get("x-liyagent-call") or headers.get("x-liyagent-step") or None,
        bearer=bool(bearer),
        host=headers.get("host") or None,
        bearer_token=bearer,
        form=form,
    )


def record_of(request: Request, response: Response) -> records.RequestRecord:
    """The request record for one answered request (a model's answer: with its usage)."""
    usage = response.payload.get("usage") if isinstance(response.payload, dict) else None
    tokens = usage if isinstance(usage, dict) and response.status == 200 else {}
    return records.RequestRecord(
        prompt_tokens=tokens.get("prompt_tokens"),
        completion_tokens=tokens.get("completion_tokens"),
        cached_tokens=(tokens.get("prompt_tokens_details") or {}).get("cached_tokens"),
        vendor=request.vendor,
        method=request.method,
        path=request.target,
        idem_key=request.idem_key,
        run_id=request.run_id,
        attempt=request.attempt,
        body=request.body,
        status=response.status,
        deduped=response.deduped,
        call=request.call,
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
