"""A provider-like limit on the scripted model's tokens: `tokens` (prompt + completion, as
OpenAI's TPM counts them), `input_tokens` and `output_tokens` (apart, as Anthropic's ITPM and
OTPM do), each per window of `window_s` (60: a provider's minute; shorter for a short test).

Counted the way providers document it: a bucket per limit, full at first, refilled
continuously at the limit per window and never above it (Anthropic: "a token bucket
algorithm"; OpenAI's `x-ratelimit-reset-tokens` says the same). A request is charged the usage
its own answer reports, when it is answered; one that does not fit is answered 429, charged
nothing, with `Retry-After` (whole seconds until it would fit, rounded up, or `retry_after_s`)
and OpenAI's error body for a token limit (`type` the limit, `code` rate_limit_exceeded). One
larger than a whole bucket never fits: 429 "Request too large", as OpenAI answers it.

A provider counts with its tokenizer; the simulator's stands in: a word or a run of punctuation
is a token (JSON's `":"` one, as a BPE merges it), and each message costs 3 more, the reply 3
(OpenAI's cookbook counts).
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

from sqlalchemy import Connection, text

from simulators.wire import Response

# A limit's field, and the usage it counts.
DIMENSIONS = ("tokens", "input_tokens", "output_tokens")
_WORDS = re.compile(r"\w+|[^\w\s]+")
PER_MESSAGE = 3
PER_REPLY = 3

_READ = """
SELECT tokens, input_tokens, output_tokens, tokens_left, input_tokens_left,
    output_tokens_left, window_ms, retry_after_s,
    EXTRACT(EPOCH FROM clock_timestamp() - tokens_at) AS since_s
FROM sim.model_limits WHERE id = :id FOR UPDATE
"""
_TAKE = """
UPDATE sim.model_limits SET tokens_left = :tokens, input_tokens_left = :input_tokens,
    output_tokens_left = :output_tokens, tokens_at = clock_timestamp()
WHERE id = :id
"""


def count(value: Any) -> int:
    """The simulator's tokens in a text (or anything JSON: its text)."""
    if value is None:
        return 0
    raw = value if isinstance(value, str) else json.dumps(value, sort_keys=True)
    return len(_WORDS.findall(raw))


def prompt_tokens(messages: list[Any]) -> int:
    """A request's input tokens: each message's text, tool calls and name, and its overhead."""
    total = PER_REPLY
    for message in messages:
        if not isinstance(message, dict):
            total += count(message)
            continue
        total += PER_MESSAGE + count(message.get("content")) + count(message.get("name"))
        total += count(message.get("tool_calls"))
    return total


def completion_tokens(message: dict[str, Any]) -> int:
    """An answer's output tokens: its text and its tool calls' names and arguments."""
    total = count(message.get("content"))
    for call in message.get("tool_calls") or []:
        function = call.get("function", {})
        total += PER_MESSAGE + count(function.get("name")) + count(function.get("arguments"))
    return total


def refused(conn: Connection, limit_id: str, model: str, usage: dict[str, int]) -> Response | None:
    """The 429 an answer of `usage` gets past the token limits, else None, its usage charged
    (the row lock makes the charge atomic across the simulator's threads; no row, no limit)."""
    row = conn.execute(text(_READ), {"id": limit_id}).mappings().first()
    if row is None or all(row[d] is None for d in DIMENSIONS):
        return None
    window_s = row["window_ms"] / 1000
    asked = {
        "tokens": usage["prompt_tokens"] + usage["completion_tokens"],
        "input_tokens": usage["prompt_tokens"],
        "output_tokens": usage["completion_tokens"],
    }
    left: dict[str, float] = {}
    worst: tuple[float, str] | None = None
    for dim in DIMENSIONS:
        cap = row[dim]
        if cap is None:
            continue
        had = row[f"{dim}_left"]
        since = float(row["since_s"] or 0)
        level = float(cap) if had is None else min(cap, had + since * cap / window_s)
        left[dim] = level
        if asked[dim] > cap:
            return _too_large(model, dim, cap, asked[dim], row["retry_after_s"], window_s)
        short = asked[dim] - level
        if short > 0 and (worst is None or short * window_s / cap > worst[0]):
            worst = (short * window_s / cap, dim)
    if worst is not None:
        wait_s, dim = worst
        used = round(row[dim] - left[dim])
        return _limited(model, dim, row[dim], used, asked[dim], wait_s, row, window_s)
    taken = {d: left[d] - asked[d] if d in left else None for d in DIMENSIONS}
    conn.execute(text(_TAKE), {"id": limit_id, **taken})
    return None


def _limited(
    model: str, dim: str, cap: int, used: int, asked: int, wait_s: float, row: Any, window: float
) -> Response:
    """OpenAI's answer past a token limit: its message names the limit, used and requested."""
    wait = row["retry_after_s"]
    if wait is None:
        wait = max(1, math.ceil(wait_s))
    message = (
        f"Rate limit reached for {model} in organization org-sim on {_name(dim)} per "
        f"{window:g}s: Limit {cap}, Used {used}, Requested {asked}. "
        f"Please try again in {wait_s:.3f}s."
    )
    payload = {
        "error": {"message": message, "type": dim, "param": None, "code": "rate_limit_exceeded"}
    }
    return Response(429, payload, headers={"Retry-After": str(wait)})


def _too_large(
    model: str, dim: str, cap: int, asked: int, retry_after: int | None, window: float
) -> Response:
    """A request no bucket can hold: OpenAI's "Request too large" (a 429 too)."""
    message = (
        f"Request too large for {model} in organization org-sim on {_name(dim)} per "
        f"{window:g}s: Limit {cap}, Requested {asked}. The input or output tokens must be "
        "reduced in order to run successfully."
    )
    payload = {
        "error": {"message": message, "type": dim, "param": None, "code": "rate_limit_exceeded"}
    }
    wait = retry_after if retry_after is not None else max(1, math.ceil(window))
    return Response(429, payload, headers={"Retry-After": str(wait)})


def _name(dim: str) -> str:
    return dim.replace("_", " ")
