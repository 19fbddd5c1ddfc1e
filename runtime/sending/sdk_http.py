"""httpx2 clients for the SDKs we build on (the MCP SDK, Anthropic's), whose every request
leaves through a guarded pooled httpx client of `http.py`.

Both SDKs speak `httpx2`, a fork of httpx with its own transports, so they cannot be handed our
`httpx` clients directly. Instead they get an `httpx2` client whose transport hands each request
to our client: the send guard (the lease deadline checked just before bytes leave, reads ended
by it) and the process's connection pool then apply to SDK traffic exactly as to a tool's
`ctx.http`. The SDK sees httpx2 responses and httpx2 errors, so its own handling is unchanged;
`SendRefused` passes through untouched, since it must stop the attempt, not be retried.

Inside a bound on answers (`bounded.answers_at_most`: a model step), an answer is handed to the
SDK decoded and cut off past the bound, so an SDK never holds more of a huge answer than the
bound. The SDK sees the cut as a failed read (an httpx2 `ReadError`, as for any transport
failure) whose cause is `bounded.ResponseTooLarge`, found again by `bounded.found_in`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from typing import Any

import httpx
import httpx2

from runtime.sending import bounded, http


def _out(
    client: httpx.Client | httpx.AsyncClient,
    request: httpx2.Request,
    body: bytes,
    extra: Mapping[str, str],
) -> httpx.Request:
    """The SDK's request as one for our client (its timeouts kept, our headers added)."""
    headers = [(k, v) for k, v in request.headers.multi_items() if k.lower() not in extra]
    headers += [(k.lower(), v) for k, v in extra.items()]
    extensions: dict[str, Any] = {}
    if "timeout" in request.extensions:
        extensions["timeout"] = request.extensions["timeout"]
    return client.build_request(
        request.method, str(request.url), headers=headers, content=body, extensions=extensions
    )


def as_httpx2_error(exc: httpx.HTTPError, request: httpx2.Request) -> httpx2.HTTPError:
    """The httpx2 error of the same name (ReadTimeout stays ReadTimeout), so the SDK reacts to
    our client's failures as it would to its own."""
    kind = getattr(httpx2, type(exc).__name__, None)
    if not (isinstance(kind, type) and issubclass(kind, httpx2.TransportError)):
        kind = httpx2.TransportError
    return kind(str(exc) or type(exc).__name__, request=request)


def as_httpx_error(
    exc: httpx2.TransportError | httpx2.InvalidURL,
) -> httpx.TransportError | httpx.InvalidURL:
    """The other way round: an SDK's httpx2 error as httpx's of the same name (a timeout at
    least a timeout), for code that judges httpx's errors (`runtime/models/errors.classify`)."""
    if isinstance(exc, httpx2.InvalidURL):
        return httpx.InvalidURL(str(exc))
    kind = getattr(httpx, type(exc).__name__, None)
    if not (isinstance(kind, type) and issubclass(kind, httpx.TransportError)):
        kind = httpx.TimeoutException if isinstance(exc, httpx2.TimeoutException) else None
    return (kind or httpx.TransportError)(str(exc) or type(exc).__name__)


# Headers that describe a body as it came over the wire: a bounded answer is handed on decoded.
_WIRE_HEADERS = frozenset({"content-encoding", "content-length", "transfer-encoding"})


def _response(source: httpx.Response, stream: Any, limit: int | None) -> httpx2.Response:
    headers = source.headers.multi_items()
    if limit is not None:
        headers = [(k, v) for k, v in headers if k.lower() not in _WIRE_HEADERS]
    return httpx2.Response(
        source.status_code,
        headers=headers,
        stream=stream,
        extensions={"http_version": source.http_version.encode()},
    )


def _cut(exc: bounded.ResponseTooLarge, request: httpx2.Request) -> httpx2.ReadError:
    """An answer cut off past its bound as the SDK expects a failed read: an httpx2 error,
    raised from the `ResponseTooLarge` that says why."""
    error = httpx2.ReadError(str(exc), request=request)
    error.__cause__ = exc
    return error


def _declared_over(
    response: httpx.Response, request: httpx2.Request, limit: int | None
) -> httpx2.ReadError | None:
    """The refusal of an answer that declares more than the bound: its body is never read."""
    size = bounded.declared(response.headers)
    if limit is not None and size is not None and size > limit:
        return _cut(bounded.ResponseTooLarge(limit, 0, size), request)
    return None


class _Body(httpx2.SyncByteStream):
    """A response body read from our client, its errors named as httpx2's; with a `limit`,
    decoded and cut off past it."""

    def __init__(
        self, response: httpx.Response, request: httpx2.Request, limit: int | None
    ) -> None:
        self._response = response
        self._request = request
        self._limit = limit

    def __iter__(self) -> Iterator[bytes]:
        try:
            if self._limit is None:
                yield from self._response.iter_raw()
            else:
                yield from bounded.capped(self._response.iter_bytes(), self._limit)
        except httpx.HTTPError as exc:
            raise as_httpx2_error(exc, self._request) from exc
        except bounded.ResponseTooLarge as exc:
            raise _cut(exc, self._request) from exc

    def close(self) -> None:
        self._response.close()


class _AsyncBody(httpx2.AsyncByteStream):
    def __init__(
        self, response: httpx.Response, request: httpx2.Request, limit: int | None
    ) -> None:
        self._response = response
        self._request = request
        self._limit = limit

    async def __aiter__(self) -> AsyncIterator[bytes]:
        try:
            if self._limit is None:
                async for chunk in self._response.aiter_raw():
                    yield chunk
            else:
                async for chunk in bounded.acapped(self._response.aiter_bytes(), self._limit):
                    yield chunk
        except httpx.HTTPError as exc:
            raise as_httpx2_error(exc, self._request) from exc
        except bounded.ResponseTooLarge as exc:
            raise _cut(exc, self._request) from exc

    async def aclose(self) -> None:
        await self._response.aclose()


class GuardedTransport(httpx2.BaseTransport):
    """Sends an SDK's requests through our guarded pooled client (sync)."""

    def __init__(
        self,
        client: Callable[[], httpx.Client] = http.shared_client,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        self._client = client
        self._headers = {k.lower(): v for k, v in (headers or {}).items()}

    def handle_request(self, request: httpx2.Request) -> httpx2.Response:
        client = self._client()
        out = _out(client, request, request.read(), self._headers)
        limit = bounded.in_force()
        try:
            response = client.send(out, stream=True)
        except httpx.HTTPError as exc:
            raise as_httpx2_error(exc, request) from exc
        refused = _declared_over(response, request, limit)
        if refused is not None:
            response.close()
            raise refused
        return _response(response, _Body(response, request, limit), limit)


class AsyncGuardedTransport(httpx2.AsyncBaseTransport):
    """Sends an SDK's requests through our guarded pooled client (async). The client is looked
    up per request, so the per-event-loop shared client of the calling thread is used."""

    def __init__(
        self,
        client: Callable[[], httpx.AsyncClient] = http.shared_async_client,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        self._client = client
        self._headers = {k.lower(): v for k, v in (headers or {}).items()}

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        client = self._client()
        out = _out(client, request, await request.aread(), self._headers)
        limit = bounded.in_force()
        try:
            response = await client.send(out, stream=True)
        except httpx.HTTPError as exc:
            raise as_httpx2_error(exc, request) from exc
        refused = _declared_over(response, request, limit)
        if refused is not None:
            await response.aclose()
            raise refused
        return _response(response, _AsyncBody(response, request, limit), limit)


def sync_client(timeout_s: float, headers: Mapping[str, str] | None = None) -> httpx2.Client:
    """An httpx2 client for a sync SDK; nothing of its own is pooled, so it is cheap."""
    return httpx2.Client(
        transport=GuardedTransport(headers=headers), timeout=httpx2.Timeout(timeout_s)
    )


def async_client(
    timeout_s: float,
    headers: Mapping[str, str] | None = None,
    client: Callable[[], httpx.AsyncClient] = http.shared_async_client,
) -> httpx2.AsyncClient:
    """An httpx2 client for an async SDK, over `client` (default: this thread's shared one)."""
    return httpx2.AsyncClient(
        transport=AsyncGuardedTransport(client, headers), timeout=httpx2.Timeout(timeout_s)
    )
