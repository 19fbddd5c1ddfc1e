"""A provider-like rate limit on the scripted model's chat completions: at most `requests`
in each window of `window_s` (a window starts with the first request after the last one
ended), and past it a 429 with `Retry-After` and an OpenAI-shaped error body, recorded like
any other answer. `requests: 0` is a switch: every request of the window is answered 429.
Tokens per window too (`tokens`, `input_tokens`, `output_tokens`: simulators/token_limit.py).

`POST /sim/model/limit {"requests"?, "tokens"?, "input_tokens"?, "output_tokens"?,
"window_s", "retry_after_s"?}` sets it (at least one limit; the window starts afresh, the
token buckets full); `DELETE /sim/model/limit` lifts it. Retry-After says `retry_after_s` when
given, else the whole seconds left in the window (rounded up: a client that waits it is never
early).
"""

from __future__ import annotations

import math

from sqlalchemy import Connection, text

from simulators.token_limit import DIMENSIONS
from simulators.wire import Call, HttpError, Response, _json_object, _number

# One limit: the chat-completions endpoint's (a provider's limit is per key, not per model).
LIMIT_ID = "chat"
MAX_WINDOW_S = 3600
MAX_TOKENS = 1_000_000_000

# Counts this request in the current window, or opens a new one (the row lock makes the count
# atomic across the simulator's threads); no row, no limit (and no lock taken).
_ADMIT = """
UPDATE sim.model_limits SET
    window_start = CASE WHEN window_start IS NULL
        OR clock_timestamp() >= window_start + window_ms * interval '1 millisecond'
        THEN clock_timestamp() ELSE window_start END,
    used = CASE WHEN window_start IS NULL
        OR clock_timestamp() >= window_start + window_ms * interval '1 millisecond'
        THEN 1 ELSE used + 1 END
WHERE id = :id
RETURNING used, requests, retry_after_s,
    EXTRACT(EPOCH FROM window_start + window_ms * interval '1 millisecond' - clock_timestamp())
        AS left_s
"""


def set_limit(call: Call) -> Response:
    """Set (or replace) the limit; its first window starts with the next request."""
    body = _json_object(call.request)
    if all(body.get(name) is None for name in ("requests", *DIMENSIONS)):
        names = ", ".join(f'"{name}"' for name in ("requests", *DIMENSIONS))
        raise HttpError(400, f"give at least one limit: {names}")
    requests = _whole(body, "requests", 0, 1_000_000)
    tokens = {dim: _whole(body, dim, 1, MAX_TOKENS) for dim in DIMENSIONS}
    window_s = _number(body, "window_s", 1.0, 0.001, MAX_WINDOW_S)
    retry_after = _whole(body, "retry_after_s", 0, MAX_WINDOW_S)
    call.conn.execute(
        text(
            "INSERT INTO sim.model_limits (id, requests, window_ms, retry_after_s, tokens, "
            "input_tokens, output_tokens) VALUES (:id, :n, :w, :ra, :tokens, :input_tokens, "
            ":output_tokens) ON CONFLICT (id) DO UPDATE SET requests = :n, window_ms = :w, "
            "retry_after_s = :ra, window_start = NULL, used = 0, tokens = :tokens, "
            "input_tokens = :input_tokens, output_tokens = :output_tokens, tokens_left = NULL, "
            "input_tokens_left = NULL, output_tokens_left = NULL, tokens_at = NULL"
        ),
        {"id": LIMIT_ID, "n": requests, "w": round(window_s * 1000), "ra": retry_after, **tokens},
    )
    said = {"requests": requests, **tokens, "window_s": window_s, "retry_after_s": retry_after}
    return Response(201, said)


def _whole(body: dict[str, object], name: str, low: int, high: int) -> int | None:
    """A whole-number field within [low, high], None when absent or null; else 400 naming it."""
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise HttpError(400, f'"{name}" must be a whole number {low}..{high}')
    return value


def lift_limit(call: Call) -> Response:
    """No limit from now on."""
    call.conn.execute(text("DELETE FROM sim.model_limits WHERE id = :id"), {"id": LIMIT_ID})
    return Response(200, {"lifted": True})


def refused(conn: Connection) -> Response | None:
    """The 429 this request gets past the limit, or None when it is within it (or no limit)."""
    row = conn.execute(text(_ADMIT), {"id": LIMIT_ID}).first()
    if row is None or row.requests is None or row.used <= row.requests:
        return None
    wait = row.retry_after_s
    if wait is None:
        wait = max(1, math.ceil(float(row.left_s)))
    message = (
        f"Rate limit reached: {row.requests} requests per window. Please try again in {wait}s."
    )
    payload = {"error": {"message": message, "type": "requests", "code": "rate_limit_exceeded"}}
    return Response(429, payload, headers={"Retry-After": str(wait)})
