"""Deciding, in one place, whether a failed model HTTP call is worth asking again.

The HTTP client never retries on its own; the engine retries a `ModelError(retryable=True)`
after `retry_after_s`, so every retry decision a provider makes comes from `classify`.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Mapping
from email.utils import parsedate_to_datetime

import httpx

from runtime.models.base import ModelError

# Statuses that say "not now" rather than "not this request": the same request may succeed.
# (Every 5xx but PERMANENT_5XX is too, Anthropic's 529 "overloaded" among them.)
RETRYABLE_STATUSES = frozenset({408, 429})
# 5xx that describe the request or server, not a transient state: asking again cannot help.
PERMANENT_5XX = frozenset({501, 505})
# Enough of a provider's error message to act on, without pasting a whole HTML error page.
MESSAGE_LIMIT = 300
# 429 error codes that mean the account is out of credit: waiting a few seconds cannot help.
QUOTA_CODES = frozenset({"insufficient_quota", "billing_hard_limit_reached"})

_NEXT_STEP = {
    400: "check the run's model spec (model, max_tokens, temperature) and tool parameter schemas",
    403: "check that the key's organization and project may use this model",
    404: "check base_url (it usually ends in /v1) and the model name",
    413: "the conversation is too large for the provider; shorten the input or the tool results",
    422: "check the run's model spec and tool parameter schemas",
}


def classify(
    status: int | None,
    headers: Mapping[str, str] | None,
    exc: Exception | None,
    *,
    body: str = "",
    key_env: str = "OPENAI_API_KEY",
    hints: Mapping[int, str] | None = None,
) -> ModelError:
    """The ModelError for a failed call: from its HTTP status (with headers and error body) or,
    when no response came, from the exception; retryable only when asking again may help.
    `hints` replaces the next step said for a status where a provider differs (its base_url)."""
    if status is None:
        return _from_exception(exc)
    lowered = {k.lower(): v for k, v in (headers or {}).items()}
    message, code = error_detail(body)
    said = f"the model provider answered HTTP {status}" + (f": {message}" if message else "")
    if status == 429 and code in QUOTA_CODES:
        return ModelError(
            f"{said}; the account is out of quota, check its plan and billing", retryable=False
        )
    if status in RETRYABLE_STATUSES or (status >= 500 and status not in PERMANENT_5XX):
        return ModelError(
            f"{said}; asking again may help", retryable=True, retry_after_s=retry_after(lowered)
        )
    if status == 401:
        return ModelError(
            f"{said}; check that {key_env} holds a valid API key for this base_url",
            retryable=False,
        )
    hint = {**_NEXT_STEP, **(hints or {})}.get(
        status, "see the provider's documentation for this status"
    )
    return ModelError(f"{said}; {hint}", retryable=False)


def _from_exception(exc: Exception | None) -> ModelError:
    """No response: a timeout or lost connection is transient, a bad URL is not."""
    what = f"{type(exc).__name__}: {exc}" if exc is not None else "no response and no error"
    if isinstance(exc, httpx.UnsupportedProtocol | httpx.InvalidURL):
        return ModelError(
            f"the model provider cannot be called ({what}); check base_url", retryable=False
        )
    if isinstance(exc, httpx.TimeoutException | TimeoutError):
        return ModelError(
            f"the model provider did not answer in time ({what}); asking again may help",
            retryable=True,
        )
    if isinstance(exc, httpx.TransportError | ConnectionError):
        return ModelError(
            f"the connection to the model provider failed ({what}); asking again may help",
            retryable=True,
        )
    return ModelError(f"the model provider call failed ({what})", retryable=False)


def retry_after(headers: Mapping[str, str]) -> float | None:
    """Seconds the provider asks us to wait (lower-cased headers): `retry-after-ms` is the
    precise one, else `retry-after` as seconds or an HTTP date; None when absent or unreadable."""
    ms = _number(headers.get("retry-after-ms"))
    if ms is not None:
        return ms / 1000
    raw = headers.get("retry-after")
    if raw is None:
        return None
    seconds = _number(raw)
    if seconds is not None:
        return seconds
    try:
        when = parsedate_to_datetime(raw.strip())
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        return None  # RFC 9110 dates are GMT; a date without a zone cannot be placed in time
    return max(0.0, when.timestamp() - time.time())


def _number(raw: str | None) -> float | None:
    """A non-negative finite number of the header's text, or None."""
    if raw is None:
        return None
    try:
        value = float(raw.strip())
    except ValueError:
        return None
    return value if math.isfinite(value) and value >= 0 else None


def error_detail(body: str) -> tuple[str, str | None]:
    """The provider's error message (truncated) and error code from an error body; a body that
    is not the usual `{"error": {"message": ...}}` JSON is quoted as text."""
    text = body.strip()
    if not text:
        return "", None
    try:
        parsed = json.loads(text)
    except ValueError:
        return _truncate(" ".join(text.split())), None
    error = parsed.get("error") if isinstance(parsed, dict) else None
    if isinstance(error, dict):
        code = error.get("code") or error.get("type")
        return _truncate(str(error.get("message") or "")), str(code) if code else None
    if isinstance(error, str):
        return _truncate(error), None
    if isinstance(parsed, dict) and isinstance(parsed.get("message"), str):
        return _truncate(parsed["message"]), None
    return _truncate(" ".join(text.split())), None


def _truncate(text: str) -> str:
    return text if len(text) <= MESSAGE_LIMIT else text[: MESSAGE_LIMIT - 3] + "..."
