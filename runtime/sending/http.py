"""Every request that leaves a worker: one pooled HTTP client per process, and the send guard.

Postgres cannot stop a paused process whose write goes to a vendor. So the guard sits where the
bytes leave: immediately before request bytes are written to a socket, the attempt's local lease
deadline (monotonic clock, no network) is checked, and every wait for an answer ends at that
deadline (which moves on while the heartbeat renews the lease) or at the request's own total
timeout, whichever comes first. A request of an attempt that lost its lease has therefore been
refused, or abandoned by this client, before any other attempt can claim the run.

A request leaves in one write: its head and body are held until the request is complete (the
empty write that ends an HTTP/1.1 message, or the first read of its answer) and are checked and
handed to the kernel together, so a process paused between head and body sends nothing, never
a head without its body. Only a request larger than `HOLD_MAX_BYTES` leaves in parts.

What no client can close: bytes already handed to the kernel when a pause begins, the
microseconds between the check and the `send`, and a vendor that goes on processing a request
its client abandoned. That is why only keyed writes are ever sent again and why an empty
read-back is reported, never resent (see `settlement.py`).

The guard in force is a context variable set for the duration of an attempt (`guarded`); a
process that runs no attempt (the front, the CLI) sends with timeouts only.

The guard also tells, per tool call (`traffic.py`), whether any request of that call may have
left: the first request byte it lets through marks the call's traffic.
"""

from __future__ import annotations

import contextlib
import ssl
import threading
import time
from collections.abc import Iterable, Iterator
from contextvars import ContextVar
from typing import Any, Protocol

import httpcore
import httpx

from runtime.base import process
from runtime.sending import traffic
from runtime.sending.in_flight import InFlight
from store.errors import LiyagentError

# Idle keep-alive connections are reused for this long (a vendor closing them sooner is fine:
# the pool notices a closed socket before reusing it).
KEEPALIVE_S = 30.0
# Each thread has its own pooled client (`shared_client`). A thread has at most one request open
# at a time on it, to the model or to a vendor, so the bound of 64 is never what a thread waits
# for, and every connection it opens is kept alive: a pool whose bound was under the threads in
# flight (64 for a `-P threads -c 200` worker) queued model calls behind each other, and one
# that kept fewer alive than it used (16) closed and reconnected most of them, a TCP connect per
# step. A client of its own also keeps each pool small: httpcore checks every idle connection
# of a pool (a socket poll each) on every request and every answer, and a client shared by 8
# threads held about 16 of them.
LIMITS = httpx.Limits(
    max_connections=64, max_keepalive_connections=64, keepalive_expiry=KEEPALIVE_S
)


# A request's bytes are held until it is complete, up to this many: a larger one (a long
# conversation sent to a model) leaves in parts of about this size.
HOLD_MAX_BYTES = 1 << 20


class _Held:
    """The bytes of the request being written on one connection, held so they leave at once."""

    def __init__(self) -> None:
        self._parts: list[bytes] = []
        self._size = 0

    def add(self, buffer: bytes) -> bytes:
        """Hold `buffer`; what must leave now: all that is held once the request has ended
        (an empty write ends an HTTP/1.1 message) or the hold is full, else nothing."""
        if buffer:
            self._parts.append(buffer)
            self._size += len(buffer)
            if self._size < HOLD_MAX_BYTES:
                return b""
        return self.take()

    def take(self) -> bytes:
        """Everything held, now leaving (before a read: its request has been written whole)."""
        data = b"".join(self._parts)
        self._parts.clear()
        self._size = 0
        return data


def _leaving(data: bytes) -> bool:
    """Check the guard for bytes about to leave (I3 for vendors) and mark the call's traffic."""
    if not data:
        return False
    check_leaving()  # the last moment before the bytes leave; from here they may arrive
    return True


class SendGuard(Protocol):
    """What the guard asks of an attempt: how long it may still send, by the local clock, and
    where its reads wait (cut when its lease is lost)."""

    in_flight: InFlight

    def send_time_left_s(self) -> float:
        """Seconds this attempt may still send; zero or less means its lease may be gone."""
        ...

    def regained(self) -> bool:
        """With no time left: whether that was a store blip the lease came through (waits for
        the lease to be confirmed again, or lost); True lets the request leave after all."""
        ...

    def why_not(self) -> str:
        """Why sending is refused now (names the run and attempt), for the error."""
        ...


class SendRefused(LiyagentError):
    """The send guard refused a request before its bytes left: the attempt's lease may have
    lapsed, so another attempt may own the run. The attempt must stop; nothing was sent."""


_guard: ContextVar[SendGuard | None] = ContextVar("liyagent_send_guard", default=None)
# Monotonic deadline of the request being made in this context (its total timeout).
_deadline: ContextVar[float | None] = ContextVar("liyagent_request_deadline", default=None)


@contextlib.contextmanager
def guarded(guard: SendGuard) -> Iterator[None]:
    """Every request made in this context (and tasks it starts) passes `guard`."""
    token = _guard.set(guard)
    try:
        yield
    finally:
        _guard.reset(token)


@contextlib.contextmanager
def total_timeout(seconds: float | None) -> Iterator[None]:
    """Requests made in this context end after `seconds` in all (connect, send and answer)."""
    if seconds is None:
        yield
        return
    token = _deadline.set(time.monotonic() + seconds)
    try:
        yield
    finally:
        _deadline.reset(token)


def check_send() -> None:
    """Raise `SendRefused` unless the attempt in force may still send (no network). A request
    that meets a store blip (Redis failing over, a dropped connection) waits, unsent, until
    the heartbeat has confirmed the lease again, as a write at a step boundary does, instead
    of stopping a live attempt whose run would then be charged a loss; a lease lost meanwhile
    (its run claimed elsewhere) is refused (I3)."""
    guard = _guard.get()
    if guard is not None and guard.send_time_left_s() <= 0 and not guard.regained():
        raise SendRefused(guard.why_not())


def check_leaving() -> None:
    """`check_send`, then count a request of the call in force as possibly sent: for a tool
    about to send with a client of its own (a vendor SDK) right before its request."""
    check_send()
    traffic.leaving()


def _bound(timeout: float | None) -> float | None:
    """`timeout` shortened to the time the guard and the request's deadline leave."""
    limits = [t for t in (timeout, _left()) if t is not None]
    return max(0.001, min(limits)) if limits else None


def _left() -> float | None:
    left: list[float] = []
    guard = _guard.get()
    if guard is not None:
        left.append(guard.send_time_left_s())
    deadline = _deadline.get()
    if deadline is not None:
        left.append(deadline - time.monotonic())
    return min(left) if left else None


def _expired(started: float, timeout: float | None) -> str | None:
    """Why a wait for an answer must end now, or None while it may go on."""
    guard = _guard.get()
    if guard is not None and guard.send_time_left_s() <= 0:
        return f"abandoned: {guard.why_not()}"
    deadline = _deadline.get()
    if deadline is not None and time.monotonic() >= deadline:
        return "the request's total timeout passed"
    if timeout is not None and time.monotonic() - started >= timeout:
        return "timed out"
    return None


def _reading(stream: Any) -> contextlib.AbstractContextManager[None]:
    """While a read waits on `stream`: where the guard in force can cut it (its lease lost)."""
    guard = _guard.get()
    return contextlib.nullcontext() if guard is None else guard.in_flight.reading(stream)


def _abandoned(started: float, timeout: float | None) -> None:
    """Raise `ReadTimeout` naming why when a wait for an answer must end now."""
    why = _expired(started, timeout)
    if why is not None:
        raise httpcore.ReadTimeout(why) from None


class GuardedStream(httpcore.NetworkStream):
    """A socket stream that holds a request's bytes until it is complete, checks the guard as
    they leave (in one write), and ends every read by the guard's deadline (re-read after each
    slice, so a renewed lease lets a long answer come)."""

    def __init__(self, inner: httpcore.NetworkStream) -> None:
        self._inner = inner
        self._held = _Held()

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        data = self._held.add(buffer)
        if _leaving(data):
            self._inner.write(data, _bound(timeout))

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        data = self._held.take()
        if _leaving(data):
            self._inner.write(data, _bound(timeout))
        started = time.monotonic()
        with _reading(self._inner):
            while True:
                slice_s = _bound(
                    None if timeout is None else timeout - (time.monotonic() - started)
                )
                try:
                    got = self._inner.read(max_bytes, slice_s)
                except (httpcore.ReadTimeout, httpcore.ReadError) as exc:
                    _abandoned(started, timeout)
                    if isinstance(exc, httpcore.ReadError):
                        raise
                    continue
                if not got:  # the connection closed: by the peer, or cut here
                    _abandoned(started, timeout)
                return got

    def close(self) -> None:
        self._inner.close()

    def start_tls(
        self,
        ssl_context: Any,
        server_hostname: str | None = None,
        timeout: float | None = None,
    ) -> httpcore.NetworkStream:
        return GuardedStream(self._inner.start_tls(ssl_context, server_hostname, _bound(timeout)))

    def get_extra_info(self, info: str) -> Any:
        return self._inner.get_extra_info(info)


class GuardedBackend(httpcore.NetworkBackend):
    """Opens connections whose streams pass the guard; connecting itself is bounded by it."""

    def __init__(self, inner: httpcore.NetworkBackend) -> None:
        self._inner = inner

    def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.NetworkStream:
        check_send()
        with traffic.guard_connecting():
            stream = self._inner.connect_tcp(
                host, port, _bound(timeout), local_address, socket_options
            )
        return GuardedStream(stream)

    def connect_unix_socket(
        self,
        path: str,
        timeout: float | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.NetworkStream:
        check_send()
        with traffic.guard_connecting():
            inner = self._inner.connect_unix_socket(path, _bound(timeout), socket_options)
        return GuardedStream(inner)

    def sleep(self, seconds: float) -> None:
        self._inner.sleep(seconds)


class GuardedAsyncStream(httpcore.AsyncNetworkStream):
    """The async twin of `GuardedStream`."""

    def __init__(self, inner: httpcore.AsyncNetworkStream) -> None:
        self._inner = inner
        self._held = _Held()

    async def write(self, buffer: bytes, timeout: float | None = None) -> None:
        data = self._held.add(buffer)
        if _leaving(data):
            await self._inner.write(data, _bound(timeout))

    async def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        data = self._held.take()
        if _leaving(data):
            await self._inner.write(data, _bound(timeout))
        started = time.monotonic()
        with _reading(self._inner):
            while True:
                slice_s = _bound(
                    None if timeout is None else timeout - (time.monotonic() - started)
                )
                try:
                    got = await self._inner.read(max_bytes, slice_s)
                except (httpcore.ReadTimeout, httpcore.ReadError) as exc:
                    _abandoned(started, timeout)
                    if isinstance(exc, httpcore.ReadError):
                        raise
                    continue
                if not got:  # the connection closed: by the peer, or cut here
                    _abandoned(started, timeout)
                return got

    async def aclose(self) -> None:
        await self._inner.aclose()

    async def start_tls(
        self,
        ssl_context: Any,
        server_hostname: str | None = None,
        timeout: float | None = None,
    ) -> httpcore.AsyncNetworkStream:
        inner = await self._inner.start_tls(ssl_context, server_hostname, _bound(timeout))
        return GuardedAsyncStream(inner)

    def get_extra_info(self, info: str) -> Any:
        return self._inner.get_extra_info(info)


class GuardedAsyncBackend(httpcore.AsyncNetworkBackend):
    def __init__(self, inner: httpcore.AsyncNetworkBackend) -> None:
        self._inner = inner

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        check_send()
        with traffic.guard_connecting():
            stream = await self._inner.connect_tcp(
                host, port, _bound(timeout), local_address, socket_options
            )
        return GuardedAsyncStream(stream)

    async def connect_unix_socket(
        self,
        path: str,
        timeout: float | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        check_send()
        with traffic.guard_connecting():
            inner = await self._inner.connect_unix_socket(path, _bound(timeout), socket_options)
        return GuardedAsyncStream(inner)

    async def sleep(self, seconds: float) -> None:
        await self._inner.sleep(seconds)


def _guard_transports(client: httpx.Client | httpx.AsyncClient) -> None:
    """Put the guard under every transport the client may use (proxies from the environment
    included); a transport we cannot guard is refused rather than left open."""
    transports = [client._transport, *client._mounts.values()]
    for transport in transports:
        if transport is None:
            continue
        pool = getattr(transport, "_pool", None)
        backend = getattr(pool, "_network_backend", None)
        if isinstance(backend, httpcore.NetworkBackend):
            pool._network_backend = GuardedBackend(backend)  # type: ignore[union-attr]
        elif isinstance(backend, httpcore.AsyncNetworkBackend):
            pool._network_backend = GuardedAsyncBackend(backend)  # type: ignore[union-attr]
        else:
            raise RuntimeError(f"cannot put the send guard under {type(transport).__name__}")


class _NoCookies(httpx.Cookies):
    """A jar that keeps nothing. A pooled client serves every run and call of its process, so a
    cookie one vendor's answer set would ride on other runs' requests to that vendor (one
    tenant's session in another's call); a tool that needs a cookie sends it as a header. It
    also spares every answer httpx's cookie parsing (urllib request and response wrappers)."""

    def extract_cookies(self, response: httpx.Response) -> None:
        return None


_tls_lock = threading.Lock()
_tls: ssl.SSLContext | None = None


def tls_context() -> ssl.SSLContext:
    """The process's one TLS context (httpx's default: certifi's roots, or SSL_CERT_FILE /
    SSL_CERT_DIR), shared by every client: each client building its own loaded the roots again
    (about 23 ms of CPU each, a -P threads -c 500 worker has 63 clients and a client per thread
    for async tools). An SSLContext is safe to share between threads."""
    global _tls
    if _tls is None:
        with _tls_lock:
            if _tls is None:
                _tls = httpx.create_ssl_context()
    return _tls


def new_client(timeout_s: float = 30.0) -> httpx.Client:
    """A pooled, guarded client that keeps no cookies; the client never retries (the engine
    decides)."""
    tls = tls_context()
    client = httpx.Client(
        transport=httpx.HTTPTransport(retries=0, limits=LIMITS, verify=tls),
        timeout=httpx.Timeout(timeout_s),
        limits=LIMITS,
        verify=tls,
    )
    client._cookies = _NoCookies()  # the setter would copy it into a plain jar
    _guard_transports(client)
    return client


def new_async_client(timeout_s: float = 30.0) -> httpx.AsyncClient:
    tls = tls_context()
    client = httpx.AsyncClient(
        transport=httpx.AsyncHTTPTransport(retries=0, limits=LIMITS, verify=tls),
        timeout=httpx.Timeout(timeout_s),
        limits=LIMITS,
        verify=tls,
    )
    client._cookies = _NoCookies()
    _guard_transports(client)
    return client


# Each thread's pooled clients; a forked child forgets them (runtime/base/process.py) and makes
# its own rather than share its parent's sockets.
_local = process.ThreadLocal("runtime.sending.http", "_local")


def shared_client() -> httpx.Client:
    """This thread's pooled client (keep-alive across calls and runs, see `LIMITS`); a forked
    child makes its own rather than share its parent's sockets, and one that was closed is
    replaced."""
    found: httpx.Client | None = getattr(_local, "client", None)
    if found is not None and not found.is_closed:
        return found
    client = _local.client = new_client()
    return client


def shared_async_client() -> httpx.AsyncClient:
    """This thread's pooled async client (a pool belongs to the event loop it first ran on,
    and each thread's async tools run on that thread's one loop); one that was closed (its
    loop's owner closes it before the loop ends) is replaced."""
    key = id(_loop_of_thread())
    found: tuple[int, httpx.AsyncClient] | None = getattr(_local, "async_client", None)
    if found is None or found[0] != key or found[1].is_closed:
        found = (key, new_async_client())
        _local.async_client = found
    return found[1]


def _loop_of_thread() -> object:
    import asyncio

    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None
