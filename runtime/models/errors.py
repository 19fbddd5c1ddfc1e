"""Deciding, in one place, whether a failed model HTTP call is worth asking again, and what of
it is said.

The HTTP client never retries on its own; the engine retries a `ModelError(retryable=True)`
after `retry_after_s`, so every retry decision a provider makes comes from `classify`.

A ModelError's text becomes a run's failure reason (its audit, events, transcript and log), so
it holds only what an operator needs: the status, the provider's error type or code when it is
shaped like one (`rate_limit_exceeded`), and what to do next. The provider's own message is
withheld, as is an exception's text: either may echo the prompt, a key or a URL's query.
"""

from __future__ import annotations

import json
import math
import re
import time
from collections.abc import Mapping
from email.utils import parsedate_to_datetime

import httpx

from runtime.models.base import ModelError
from runtime.sending.bounded import ResponseTooLarge

# Statuses that say "not now" rather than "not this request": the same request may succeed.
# (Every 5xx but PERMANENT_5XX is too, Anthropic's 529 "overloaded" among them.)
RETRYABLE_STATUSES = frozenset({408, 429})
# 5xx that describe the request or server, not a transient state: asking again cannot help.
PERMANENT_5XX = frozenset({501, 505})
# A provider's error type or code is said only when it is shaped like one: words of letters
# (or numbers of up to 4 digits) joined by `_`, `.` or `-`, 48 characters at most, never shaped
# like a credential. Anything else may be free text, the prompt or a key.
CODE_MAX = 48
_CODE = re.compile(r"[A-Za-z]{1,24}(?:[_.-](?:[A-Za-z]{1,24}|[0-9]{1,4}))*")
_CREDENTIAL = re.compile(r"(?i)^(?:sk|pk|rk|gh[pousr]|xox[abprs])[-_]|^AKIA")
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
    code = error_code(body)
    said = f"the model provider answered HTTP {status}" + (f" ({code})" if code else "")
    if status == 429 and code in QUOTA_CODES:
        return ModelError(
            f"{said}; the account is out of quota, check its plan and billing", retryable=False
        )
    if status in RETRYABLE_STATUSES or (status >= 500 and status not in PERMANENT_5XX):
        return ModelError(
            f"{said}; asking again may help",
            retryable=True,
            retry_after_s=retry_after(lowered),
            rate_limited=status == 429,
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
    """No response: a timeout or lost connection is transient, a bad URL is not. Only the
    exception's type is said: its text may hold the URL with its query."""
    what = type(exc).__name__ if exc is not None else "no response and no error"
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


def error_code(body: str) -> str | None:
    """The provider's error code (else its error type) from an error body, when shaped like an
    identifier (`_CODE`); None for a body without one. Its message is never read out."""
    try:
        parsed = json.loads(body) if body.strip() else None
    except ValueError:
        return None
    if not isinstance(parsed, dict):
        return None
    error = parsed.get("error")
    found = [error.get("code"), error.get("type")] if isinstance(error, dict) else []
    found.append(parsed.get("code"))
    for value in found:
        if isinstance(value, str) and identifier_shaped(value):
            return value
    return None


def identifier_shaped(value: str) -> bool:
    """Whether `value` reads as an error code (`insufficient_quota`, `overloaded_error`), not
    as text a person or a key could have put there."""
    return (
        len(value) <= CODE_MAX
        and _CODE.fullmatch(value) is not None
        and _CREDENTIAL.search(value) is None
    )


def too_large(run_id: str, exc: ResponseTooLarge) -> ModelError:
    """The model's answer passed LIYAGENT_MODEL_RESPONSE_MAX_BYTES: not asked again (the same
    request would get as much), nothing of it used."""
    return ModelError(
        f"run {run_id}: the model provider's answer was cut off: {exc}; nothing of it was used: "
        f"raise LIYAGENT_MODEL_RESPONSE_MAX_BYTES (now {exc.limit}) or have the model answer "
        "in less (max_tokens in the run's model spec)",
        retryable=False,
    )
