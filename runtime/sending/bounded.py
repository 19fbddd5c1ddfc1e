"""Reading an answer's body with a bound, so a huge answer costs the worker at most the bound.

A model provider's answer is read as a stream and given up once it passes the bound in force
(`answers_at_most`, set by the engine around each model step from
LIYAGENT_MODEL_RESPONSE_MAX_BYTES): the connection is closed, nothing of the body is used, and
`ResponseTooLarge` says how much was read. A declared `Content-Length` over the bound is refused
before any byte of the body is read. Bytes are counted decoded (after gzip or deflate), as they
land in memory.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Iterator, Mapping
from contextvars import ContextVar

import httpx

from runtime.base.settings import get_settings
from store.errors import LiyagentError

# What an error answer is read of: enough for its error type or code, never a whole page.
ERROR_BODY_BYTES = 16 << 10


class ResponseTooLarge(LiyagentError):
    """An answer's body passed the bound its reader set: reading stopped, the connection was
    closed, and nothing of the body is used."""

    def __init__(self, limit: int, read: int, declared: int | None = None) -> None:
        self.limit = limit
        self.read = read
        self.declared = declared
        if declared is not None:
            said = f"its answer declared {declared} bytes, more than {limit}; none was read"
        else:
            said = f"its answer was more than {limit} bytes; reading stopped after {read}"
        super().__init__(said)


_limit: ContextVar[int | None] = ContextVar("liyagent_answer_limit", default=None)


@contextlib.contextmanager
def answers_at_most(max_bytes: int) -> Iterator[None]:
    """Answers read in this context (a model step, its SDK's included) stop past `max_bytes`."""
    token = _limit.set(max_bytes)
    try:
        yield
    finally:
        _limit.reset(token)


def in_force() -> int | None:
    """The bound set for answers read in this context, or None outside any."""
    return _limit.get()


def found_in(exc: BaseException) -> ResponseTooLarge | None:
    """The `ResponseTooLarge` an error was raised from (an SDK's connection error over the
    transport's read error over it), if that is what it was."""
    seen: BaseException | None = exc
    for _ in range(20):  # a chain that loops back ends here
        if seen is None or isinstance(seen, ResponseTooLarge):
            return seen
        seen = seen.__cause__ or seen.__context__
    return None


def answer_limit() -> int:
    """The bound in force on a model's answer: the engine's (from its services' settings), or
    this process's LIYAGENT_MODEL_RESPONSE_MAX_BYTES when a provider is used outside a run."""
    return in_force() or get_settings().model_response_max_bytes


def declared(headers: Mapping[str, str]) -> int | None:
    """The body size an answer's headers declare, or None when they declare none readable."""
    raw = headers.get("content-length")
    try:
        return int(raw) if raw is not None else None
    except ValueError:
        return None


def read(response: httpx.Response, limit: int) -> bytes:
    """The whole decoded body of a streamed answer; `ResponseTooLarge` (the response closed)
    as soon as it declares or passes `limit` bytes."""
    size = declared(response.headers)
    if size is not None and size > limit:
        response.close()
        raise ResponseTooLarge(limit, 0, size)
    parts: list[bytes] = []
    got = 0
    for chunk in response.iter_bytes():
        got += len(chunk)
        if got > limit:
            response.close()
            raise ResponseTooLarge(limit, got)
        parts.append(chunk)
    return b"".join(parts)


def prefix(response: httpx.Response, limit: int = ERROR_BODY_BYTES) -> bytes:
    """At most the first `limit` bytes of a streamed answer's decoded body (an error answer,
    read for its error code); the rest is never read and the response is closed."""
    parts: list[bytes] = []
    got = 0
    try:
        for chunk in response.iter_bytes():
            parts.append(chunk[: limit - got])
            got += len(parts[-1])
            if got >= limit:
                break
    finally:
        response.close()
    return b"".join(parts)


def capped(chunks: Iterator[bytes], limit: int) -> Iterator[bytes]:
    """`chunks` as they come, `ResponseTooLarge` once more than `limit` bytes came."""
    got = 0
    for chunk in chunks:
        got += len(chunk)
        if got > limit:
            raise ResponseTooLarge(limit, got)
        yield chunk


async def acapped(chunks: AsyncIterator[bytes], limit: int) -> AsyncIterator[bytes]:
    """The async twin of `capped`."""
    got = 0
    async for chunk in chunks:
        got += len(chunk)
        if got > limit:
            raise ResponseTooLarge(limit, got)
        yield chunk
