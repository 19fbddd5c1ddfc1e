"""Request bodies: read at most 1 MiB of JSON and check every field by kind before anything
is called, so a bad request is refused with the field's name and nothing is stored.

Every JSON body (these routes, Teams and A2A alike) is parsed by `parse_json`: at most
`MAX_JSON_DEPTH` levels deep (deeper JSON is refused as malformed, before Python's parser can
run out of stack), and holding no string Postgres cannot store (a NUL, a lone surrogate).
"""

from __future__ import annotations

import json
import re
from typing import Any

from starlette.requests import Request

from front.errors import FrontError
from runtime.core.enqueue import BadRequest
from runtime.entries.client import parse_id

MAX_BODY_BYTES = 1 << 20
MAX_TEXT_BYTES = 64 * 1024
MAX_NAME_CHARS = 200
# Ids of events, turns, tasks and messages (the last part of a request key).
ID = re.compile(r"[A-Za-z0-9._:-]{1,200}")
# Agents, tickets and conversations: parts of a request key that another part follows, so
# no colon (else `a:b` + `c` and `a` + `b:c` would make the same key).
KEY_PART = re.compile(r"[A-Za-z0-9._-]{1,200}")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
# Arrays and objects inside one another: far more than any request here needs.
MAX_JSON_DEPTH = 64
# What Postgres refuses in text and jsonb: NUL, and UTF-16 surrogates (not Unicode text).
_UNSTORABLE = re.compile(r"[\x00\ud800-\udfff]")
_SHOWN_KEY = re.compile(r"[A-Za-z0-9_.-]{1,40}")


class BadJson(ValueError):
    """A body refused before any of it is used: `malformed` when it is not JSON this front
    parses (syntax, nesting), else JSON holding a string that cannot be stored."""

    def __init__(self, message: str, *, malformed: bool, parsed: Any = None) -> None:
        super().__init__(message)
        self.malformed = malformed
        self.parsed = parsed  # the value, when it parsed (a JSON-RPC request's id is in it)


def parse_json(raw: bytes) -> Any:
    """The JSON value of `raw`; BadJson when it is malformed, nested deeper than
    `MAX_JSON_DEPTH` or holds a NUL or a lone surrogate (the message names where, never the
    value)."""
    try:
        value = json.loads(raw, parse_constant=_no_constant)
    except RecursionError:
        raise _too_deep() from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise BadJson(f"the body is not valid JSON ({exc})", malformed=True) from None
    try:
        _check_tree(value)
    except BadJson as exc:
        exc.parsed = value
        raise
    return value


def _too_deep() -> BadJson:
    return BadJson(
        f"the body is JSON nested more than {MAX_JSON_DEPTH} levels deep; send it flatter",
        malformed=True,
    )


def _check_tree(value: Any) -> None:
    """Walk the parsed value without recursion: depth, and every key and string."""
    stack: list[tuple[Any, int, tuple[str, ...]]] = [(value, 1, ())]
    while stack:
        node, depth, where = stack.pop()
        if isinstance(node, str):
            if _UNSTORABLE.search(node):
                raise _unstorable(where)
            continue
        if not isinstance(node, dict | list):
            continue
        if depth > MAX_JSON_DEPTH:
            raise _too_deep()
        if isinstance(node, list):
            stack.extend((item, depth + 1, (*where, f"[{i}]")) for i, item in enumerate(node))
            continue
        for key, item in node.items():
            shown = (*where, key if _SHOWN_KEY.fullmatch(key) else "?")
            if _UNSTORABLE.search(key):
                raise _unstorable(shown, "a key")
            stack.append((item, depth + 1, shown))


def _unstorable(where: tuple[str, ...], what: str = "a string") -> BadJson:
    path = ".".join(where).replace(".[", "[") or "the body"
    return BadJson(
        f"{what} at {path[:200]} holds a NUL character or a lone surrogate, which cannot be "
        "stored; send valid Unicode text without NUL",
        malformed=False,
    )


async def read_limited(request: Request) -> bytes:
    """The raw body, refused with 413 once it passes 1 MiB (declared or streamed)."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > MAX_BODY_BYTES:
        raise FrontError(413, f"the body is over {MAX_BODY_BYTES} bytes; send less")
    raw = bytearray()
    async for chunk in request.stream():
        raw.extend(chunk)
        if len(raw) > MAX_BODY_BYTES:
            raise FrontError(413, f"the body is over {MAX_BODY_BYTES} bytes; send less")
    return bytes(raw)


async def read_json(request: Request) -> dict[str, Any]:
    """The body as a JSON object: 415 if it is not JSON, 413 past 1 MiB, 400 if malformed,
    too deep or holding what cannot be stored (`parse_json`)."""
    ctype = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if ctype != "application/json":
        raise FrontError(415, "send the body as JSON with Content-Type: application/json")
    raw = await read_limited(request)
    try:
        body = parse_json(raw)
    except BadJson as exc:
        raise FrontError(400, str(exc)) from None
    if not isinstance(body, dict):
        raise FrontError(400, "the body must be a JSON object")
    return body


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def path_id(value: str, what: str, pattern: re.Pattern[str] = ID) -> str:
    """A path segment that must be an id of the given shape (400 naming it otherwise)."""
    if not pattern.fullmatch(value):
        raise FrontError(400, f"{what} {value[:80]!r} must match {pattern.pattern}")
    return value


def path_uuid(value: str, what: str) -> str:
    """A path segment that must be a UUID (run and approval ids)."""
    try:
        return parse_id(value, what)
    except BadRequest as exc:
        raise FrontError(400, str(exc)) from None


def text_problem(value: str, max_bytes: int = MAX_TEXT_BYTES) -> str | None:
    """What is wrong with a user's text, as the end of a sentence naming it, or None: every
    entry point (the JSON endpoints, Teams, A2A) refuses the same texts the same way."""
    try:
        size = len(value.encode("utf-8"))
    except UnicodeEncodeError:
        return "is not valid Unicode text"
    if not value.strip():
        return "must not be empty"
    if size > max_bytes:
        return f"is {size} bytes; at most {max_bytes}"
    if "\x00" in value:
        return "must not contain NUL characters"
    return None


class Fields:
    """One JSON object's fields, each read by kind; unknown fields are refused up front."""

    def __init__(self, body: dict[str, Any], allowed: set[str]) -> None:
        unknown = sorted(set(body) - allowed)
        if unknown:
            raise FrontError(
                400, f"unknown field(s) {', '.join(unknown)}; allowed: {', '.join(sorted(allowed))}"
            )
        self.body = body

    def _get(self, name: str, kind: type, what: str) -> Any:
        if name not in self.body or self.body[name] is None:
            raise FrontError(400, f'field "{name}" is required ({what})')
        value = self.body[name]
        if type(value) is not kind:
            raise FrontError(400, f'field "{name}" must be {what}, got {type(value).__name__}')
        return value

    def text(self, name: str, max_bytes: int = MAX_TEXT_BYTES) -> str:
        """Non-empty text of at most `max_bytes` UTF-8 bytes (newlines and tabs allowed)."""
        value: str = self._get(name, str, "a non-empty string")
        problem = text_problem(value, max_bytes)
        if problem is not None:
            raise FrontError(400, f'field "{name}" {problem}')
        return value

    def name(self, name: str) -> str:
        """A short single-line name (a person, a sender, a conversation): 200 characters."""
        value = self.text(name, max_bytes=4 * MAX_NAME_CHARS)
        if len(value) > MAX_NAME_CHARS or _CONTROL.search(value):
            raise FrontError(
                400, f'field "{name}" must be one line of at most {MAX_NAME_CHARS} characters'
            )
        return value

    def ident(self, name: str, pattern: re.Pattern[str] = ID) -> str:
        value: str = self._get(name, str, f"a string matching {pattern.pattern}")
        if not pattern.fullmatch(value):
            raise FrontError(400, f'field "{name}" must match {pattern.pattern}')
        return value

    def optional_ident(self, name: str) -> str | None:
        return None if self.body.get(name) is None else self.ident(name)

    def optional_text(self, name: str, max_bytes: int = MAX_TEXT_BYTES) -> str | None:
        return None if self.body.get(name) is None else self.text(name, max_bytes)

    def flag(self, name: str) -> bool:
        value: bool = self._get(name, bool, "true or false")
        return value
