"""The front's connections, bounded: each must send its request head within the head bound
(from when it opened or its previous answer ended) and its body within the body bound (from
its head), and at most `max_connections` are open. When one more arrives at the cap, the
connection that has waited longest on its client (for a head or a body) is shed, so slow
clients cannot starve one that sends its request at once, such as a load balancer's
`/healthz`. Refusals are counted and logged as one line per interval, never one per connection
and never with a traceback.

This is uvicorn's h11 protocol with the bounds added (uvicorn itself bounds neither a head nor
a body in time, and its `limit_concurrency` counts stalled connections too, so it would answer
`/healthz` 503 while they last).
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from enum import Enum, StrEnum
from typing import Any, ClassVar

import h11
import structlog
from uvicorn.protocols.http.h11_impl import H11Protocol

from front.limits import FrontLimits

log = structlog.get_logger("front")


def _answer(status: str, text: str) -> bytes:
    body = text.encode("ascii")
    head = (
        f"HTTP/1.1 {status}\r\ncontent-type: text/plain; charset=utf-8\r\n"
        f"connection: close\r\ncontent-length: {len(body)}\r\n\r\n"
    )
    return head.encode("ascii") + body


TIMED_OUT = _answer("408 Request Timeout", "the request did not arrive in time; send it again")
FULL = _answer("503 Service Unavailable", "the front has too many connections; retry shortly")
# asyncio's message when accept() fails for want of a descriptor (or memory).
ACCEPT_FAILED = "socket.accept() out of system resource"


class Refusal(StrEnum):
    SHED = "shed"  # waited longest on its client when another connection came at the cap
    FULL = "full"  # came at the cap with no connection waiting on its client: answered 503
    HEAD_TIMEOUT = "head_timeout"  # no whole request head within the head bound
    BODY_TIMEOUT = "body_timeout"  # no whole body within the body bound
    BAD_HEAD = "bad_head"  # a head that is not HTTP (uvicorn answered 400)
    ACCEPT_FAILED = "accept_failed"  # accept() failed: too many open files (or no memory)


class Refusals:
    """Refused connections counted by reason and logged once per interval with the counts,
    so a flood of slow or broken clients costs one log line per interval."""

    def __init__(self, limits: FrontLimits) -> None:
        self.interval_s = limits.refusal_log_s
        self.limits = limits
        self.counts: Counter[Refusal] = Counter()
        self._flush: asyncio.TimerHandle | None = None

    def count(self, reason: Refusal) -> None:
        """Count one refusal; the interval's line is written at its end (by the event loop, so
        a count made off it waits for the next one made on it, or for shutdown)."""
        self.counts[reason] += 1
        if self._flush is None:
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:
                return
            self._flush = loop.call_later(self.interval_s, self.flush)

    def flush(self) -> None:
        """Log the counts since the last line, if any."""
        if self._flush is not None:
            self._flush.cancel()
            self._flush = None
        if not self.counts:
            return
        log.warning(
            "front.connections_refused",
            interval_s=self.interval_s,
            **{str(reason): n for reason, n in sorted(self.counts.items())},
            max_connections=self.limits.max_connections,
            head_timeout_s=self.limits.head_timeout_s,
            body_timeout_s=self.limits.body_timeout_s,
            next="slow or too many clients: see the front's limits and the proxy before it",
        )
        self.counts.clear()


class ConnectionGuard:
    """The open connections of one server and which of them wait on their client, longest
    first; admits a new connection by shedding the longest waiting one at the cap."""

    def __init__(self, limits: FrontLimits) -> None:
        self.limits = limits
        self.refusals = Refusals(limits)
        self.open: set[GuardedProtocol] = set()
        # Insertion order is the order they began to wait: the first is the longest waiting.
        self.waiting: dict[GuardedProtocol, None] = {}

    def admit(self, conn: GuardedProtocol) -> bool:
        """Take `conn` in, shedding the connection that has waited longest on its client when
        the cap is reached; False when every open connection is being served."""
        if len(self.open) >= self.limits.max_connections:
            if not self.waiting:
                self.refusals.count(Refusal.FULL)
                return False
            self.refusals.count(Refusal.SHED)
            next(iter(self.waiting)).drop()
        self.open.add(conn)
        return True

    def forget(self, conn: GuardedProtocol) -> None:
        self.open.discard(conn)
        self.waiting.pop(conn, None)

    def accept_failed(self, loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        """The loop's exception handler: a failed accept() (asyncio retries it a second later)
        is counted, not logged with a traceback; anything else goes to the default handler."""
        if context.get("message") == ACCEPT_FAILED:
            self.refusals.count(Refusal.ACCEPT_FAILED)
        else:
            loop.default_exception_handler(context)


class UvicornNoise(logging.Filter):
    """uvicorn's warnings written once per connection: a head that is not HTTP is counted as
    a refusal instead; an ignored Upgrade header (the front serves no WebSockets) is dropped."""

    def __init__(self, guard: ConnectionGuard) -> None:
        super().__init__()
        self.guard = guard

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if message == "Invalid HTTP request received.":
            self.guard.refusals.count(Refusal.BAD_HEAD)
            return False
        return not message.startswith(
            ("Unsupported upgrade request.", "No supported WebSocket library")
        )


class Phase(Enum):
    HEAD = "head"  # waiting for a request head (a new connection, or after an answer)
    BODY = "body"  # a head arrived; waiting for the rest of its body
    SERVED = "served"  # the request is whole: the app is answering it


class GuardedProtocol(H11Protocol):
    """uvicorn's h11 protocol with the head and body bounds and the connection cap; `guard`
    is set on the subclass `protocol_for` makes for one server."""

    guard: ClassVar[ConnectionGuard]
    _phase: Phase | None = None
    _timer: asyncio.TimerHandle | None = None
    _partial = False  # bytes of a head came in the current phase
    _asked = False  # a whole request head came on this connection before

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        if not self.guard.admit(self):
            transport.write(FULL)
            transport.close()
            return
        self._watch()

    def data_received(self, data: bytes) -> None:
        if self._phase is Phase.HEAD:
            self._partial = True
        super().data_received(data)
        self._watch()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._watch()

    def connection_lost(self, exc: Exception | None) -> None:
        self._leave()
        super().connection_lost(exc)

    def drop(self) -> None:
        """Close at once, without an answer (shed at the cap)."""
        self._leave()
        self.transport.close()

    def _leave(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self.guard.forget(self)

    def _watch(self) -> None:
        """Start the phase's bound when the connection moves to another phase."""
        if self.transport.is_closing():
            self._leave()
            return
        state = self.conn.their_state
        phase = (
            Phase.HEAD
            if state is h11.IDLE
            else Phase.BODY
            if state is h11.SEND_BODY
            else Phase.SERVED
        )
        if phase is self._phase:
            return
        if self._phase is Phase.HEAD:
            self._asked = True
        self._phase, self._partial = phase, False
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self.guard.waiting.pop(self, None)
        if phase is Phase.SERVED:
            return
        self.guard.waiting[self] = None
        limits = self.guard.limits
        bound = limits.head_timeout_s if phase is Phase.HEAD else limits.body_timeout_s
        self._timer = self.loop.call_later(bound, self._timed_out)

    def _timed_out(self) -> None:
        """The phase's bound passed: answer 408 where a request was begun and no answer was
        started, then close. An idle kept-alive connection is just closed (not a refusal)."""
        self._timer = None
        if self.transport.is_closing():
            return
        cycle = self.cycle if self._phase is Phase.BODY else None
        if self._phase is Phase.HEAD and not self._partial and self._asked:
            self.drop()
            return
        reason = Refusal.BODY_TIMEOUT if cycle is not None else Refusal.HEAD_TIMEOUT
        self.guard.refusals.count(reason)
        if (cycle is not None and not cycle.response_started) or self._partial:
            self.transport.write(TIMED_OUT)
        if cycle is not None:
            # As uvicorn does when a client leaves: the app's receive() now says disconnected
            # and whatever it sends is dropped.
            cycle.disconnected = True
            cycle.message_event.set()
        self.drop()


def protocol_for(guard: ConnectionGuard) -> type[GuardedProtocol]:
    """The protocol class uvicorn instantiates per connection, bound to one server's guard."""
    return type("GuardedH11Protocol", (GuardedProtocol,), {"guard": guard})
