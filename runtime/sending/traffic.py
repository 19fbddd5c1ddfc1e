"""What the send guard saw of one tool call: whether any of its requests may have left.

A tool that fails while no request of its call has left failed for certain: nothing was sent,
nothing changed, and the model is told its error. Only a call that may have reached its server
is in doubt and settled by its kind. The guard (`http.py`) marks a call's traffic just before
the first request byte it writes; a connection refused or timed out before that leaves it
clean. Code that sends around the guard is caught where Python can see it (a socket audit hook,
PEP 578: a connect or datagram not opened by the guard); a connection an unguarded client opened
in an earlier call and reuses is not, which is why such a tool calls `ctx.check_send()` first.
"""

from __future__ import annotations

import contextlib
import sys
import threading
from collections.abc import Iterator
from contextvars import ContextVar
from typing import Any


class Traffic:
    """Whether any request of one tool call may have left this process.

    `left` turns true, and never back, just before request bytes are written through the guard,
    when a tool about to send with a client of its own calls `ctx.check_send()`, and when code
    in the call connects or sends on a socket the guard did not open (an unguarded client). A
    connection that was refused or timed out before any request byte was written leaves it
    false. Started true for a call an earlier try may already have sent."""

    __slots__ = ("left",)

    def __init__(self, left: bool = False) -> None:
        self.left = left


_traffic: ContextVar[Traffic | None] = ContextVar("liyagent_call_traffic", default=None)
# True while the guard itself opens a connection (its socket events are not a tool's own).
_guard_connecting: ContextVar[bool] = ContextVar("liyagent_guard_connecting", default=False)
# Socket audit events (PEP 578) that mean a connection or datagram outside the guard.
_SOCKET_EVENTS = frozenset({"socket.connect", "socket.sendto", "socket.sendmsg"})
_audit_lock = threading.Lock()
_audit_installed = False


@contextlib.contextmanager
def watched(left: bool = False) -> Iterator[Traffic]:
    """Keep, for one tool call made in this context (and tasks it starts), whether any of its
    requests may have left; `left=True` for a call an earlier try may have sent."""
    _watch_sockets()
    traffic = Traffic(left)
    token = _traffic.set(traffic)
    try:
        yield traffic
    finally:
        _traffic.reset(token)


def nothing_left() -> bool:
    """True only when a call is watched and none of its requests may have left: it failed for
    certain. Unwatched (an ad hoc call, a user's own test): unknown, so False (in doubt)."""
    traffic = _traffic.get()
    return traffic is not None and not traffic.left


def leaving() -> None:
    """A request of the call in force may leave now (or has left): from here it is in doubt."""
    traffic = _traffic.get()
    if traffic is not None:
        traffic.left = True


def _socket_event(event: str, args: tuple[Any, ...]) -> None:
    """A socket opened or written outside the guard during a watched call: an unguarded client
    may have sent a request, so the call is in doubt if it fails (conservative)."""
    if event in _SOCKET_EVENTS and not _guard_connecting.get():
        leaving()


@contextlib.contextmanager
def guard_connecting() -> Iterator[None]:
    """The guard opens a connection: no request byte has been written yet (a refused connect
    leaves the call's traffic untouched); its first write is what counts."""
    token = _guard_connecting.set(True)
    try:
        yield
    finally:
        _guard_connecting.reset(token)


def _watch_sockets() -> None:
    """Install the socket audit hook once per process (hooks cannot be removed; it costs a set
    lookup per audit event and reads a context variable only on socket events)."""
    global _audit_installed
    if _audit_installed:
        return
    with _audit_lock:
        if not _audit_installed:
            sys.addaudithook(_socket_event)
            _audit_installed = True
