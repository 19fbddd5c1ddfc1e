"""The sockets an attempt is waiting on for an answer now, so a lost lease cuts them at once.

A Stop (or an erasure, or a loss limit) fences a running attempt in Postgres and drops its lease;
its holder hears that within milliseconds (runtime/fleet/drops.py) and loses the lease here.
Without a cut, a request already sent would still hold its thread until its answer came (a
model step of a minute) or its read slice ended. `cut` shuts each socket down for reading and
writing from the losing thread: the blocked read returns at once, in a thread or an event loop,
and the guard turns what it returns into `abandoned` (runtime/sending/http.py). Only the raw
socket is shut (`socket.socket.shutdown`, below TLS): the TLS object belongs to the reading
thread.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Iterator
from typing import Any


class InFlight:
    """One attempt's sockets read from now; `cut` ends every wait on them, and any later one."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._socks: set[socket.socket] = set()
        self.cut_why: str | None = None

    @contextlib.contextmanager
    def reading(self, stream: Any) -> Iterator[None]:
        """While a read on `stream` (an httpcore network stream) waits: cut with the rest."""
        sock = stream.get_extra_info("socket")
        if not isinstance(sock, socket.socket):
            yield
            return
        with self._lock:
            self._socks.add(sock)
            if self.cut_why is not None:
                _shut(sock)
        try:
            yield
        finally:
            with self._lock:
                self._socks.discard(sock)

    def cut(self, why: str) -> None:
        """End every wait for an answer now (the attempt may not use one any more)."""
        with self._lock:  # shut while registered: a socket back in its pool is never shut
            if self.cut_why is None:
                self.cut_why = why
            for sock in self._socks:
                _shut(sock)


def _shut(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        socket.socket.shutdown(sock, socket.SHUT_RDWR)
