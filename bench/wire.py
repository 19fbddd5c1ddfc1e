"""A TCP proxy that counts round trips on the wire, for the counting section.

A round trip is a burst: the client sends after the server last sent (or first, on a new
connection), then waits for the answer. A pipeline of Redis commands, or a Postgres
Parse/Bind/Execute/Sync batch, is one burst; a connection's start-up exchanges count as theirs.
For Postgres the client's messages are also parsed, to count pings (SQLAlchemy's pre-ping is an
empty query, `;`, which pg_stat_statements never sees) and simple queries apart.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from dataclasses import dataclass, field

# Postgres start-up requests answered by one byte, after which the client sends another
# untyped message (SSLRequest, GSSENCRequest).
_PRE_STARTUP = {80877103, 80877104}


@dataclass
class WireCounts:
    connections: int = 0
    round_trips: int = 0
    pings: int = 0  # Postgres only: empty simple queries

    def minus(self, other: WireCounts) -> WireCounts:
        return WireCounts(
            self.connections - other.connections,
            self.round_trips - other.round_trips,
            self.pings - other.pings,
        )


@dataclass
class _Conn:
    client_sent_last: bool = False
    startup: bool = True
    buffer: bytearray = field(default_factory=bytearray)


class CountingProxy:
    """Listens on a free loopback port and forwards to `target`, counting as it goes."""

    def __init__(self, target_host: str, target_port: int, postgres: bool = False) -> None:
        self.target = (target_host, target_port)
        self.postgres = postgres
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = int(self.listener.getsockname()[1])
        self.counts = WireCounts()
        self._lock = threading.Lock()
        self._sockets: list[socket.socket] = []
        self._closed = False
        threading.Thread(target=self._accept, name="bench-proxy", daemon=True).start()

    def snapshot(self) -> WireCounts:
        with self._lock:
            return WireCounts(self.counts.connections, self.counts.round_trips, self.counts.pings)

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self.listener.accept()
                upstream = socket.create_connection(self.target)
            except OSError:
                if self._closed:
                    return
                continue
            for s in (client, upstream):
                s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            state = _Conn()
            with self._lock:
                self._sockets += [client, upstream]
                self.counts.connections += 1
            threading.Thread(
                target=self._pump, args=(client, upstream, state, True), daemon=True
            ).start()
            threading.Thread(
                target=self._pump, args=(upstream, client, state, False), daemon=True
            ).start()

    def _pump(
        self, src: socket.socket, dst: socket.socket, state: _Conn, from_client: bool
    ) -> None:
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                with self._lock:
                    if from_client and not state.client_sent_last:
                        self.counts.round_trips += 1
                    state.client_sent_last = from_client
                    if from_client and self.postgres:
                        self.counts.pings += _pings(state, data)
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        self._closed = True
        with contextlib.suppress(OSError):
            self.listener.close()
        with self._lock:
            for s in self._sockets:
                with contextlib.suppress(OSError):
                    s.close()


def _pings(state: _Conn, data: bytes) -> int:
    """Parse the client's Postgres messages in `data`; how many were empty simple queries."""
    state.buffer += data
    found = 0
    buf = state.buffer
    while True:
        if state.startup:
            if len(buf) < 8:
                break
            length = int.from_bytes(buf[0:4], "big")
            if len(buf) < length:
                break
            code = int.from_bytes(buf[4:8], "big")
            del buf[:length]
            state.startup = code in _PRE_STARTUP
            continue
        if len(buf) < 5:
            break
        kind, length = buf[0:1], int.from_bytes(buf[1:5], "big")
        if len(buf) < 1 + length:
            break
        payload = bytes(buf[5 : 1 + length])
        del buf[: 1 + length]
        if kind == b"Q" and payload.strip(b"\x00 ;\n\t") == b"":
            found += 1
    return found
