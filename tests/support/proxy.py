"""A TCP proxy on loopback that a test can cut: one worker's path to Redis or Postgres, while
the rest of the system still reaches it."""

from __future__ import annotations

import contextlib
import errno
import socket
import threading
import time

from liyagent.local.servers import candidate_ports


class CuttableProxy:
    def __init__(
        self, target_host: str, target_port: int, port: int = 0, host: str = "127.0.0.1"
    ) -> None:
        """`port`: listen there (a cut proxy's, to bring the path back), else on a free one;
        `host`: the address to listen on (a network namespace's link to the host)."""
        self.target = (target_host, target_port)
        self.listener = _listen(host, port)
        self.port = int(self.listener.getsockname()[1])
        self._open: list[socket.socket] = []
        self._lock = threading.Lock()
        self._cut = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self._cut.is_set():
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            if self._cut.is_set():
                client.close()
                return
            try:
                upstream = socket.create_connection(self.target)
            except OSError:
                client.close()
                continue
            with self._lock:
                self._open += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    def _pipe(self, src: socket.socket, dst: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := src.recv(65536):
                dst.sendall(data)
        with contextlib.suppress(OSError):
            dst.shutdown(socket.SHUT_WR)

    def blip(self) -> None:
        """Drop every connection open now, and go on accepting new ones (a network blip, a
        restarted proxy): the worker reconnects at once."""
        with self._lock:
            dropped, self._open = self._open, []
        for sock in dropped:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()

    def cut(self) -> None:
        """Drop every connection and refuse new ones: Redis is unreachable through here."""
        self._cut.set()
        with contextlib.suppress(OSError):
            # Wakes the accept blocked in its thread: a closed socket that a thread still
            # accepts on keeps listening (its port not free to listen on again, a connection
            # accepted and dropped rather than refused) until a client comes.
            self.listener.shutdown(socket.SHUT_RDWR)
        with contextlib.suppress(OSError):
            self.listener.close()
        with self._lock:
            for sock in self._open:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
                sock.close()  # even when the peer is already gone


def _listen(host: str, port: int) -> socket.socket:
    """A listener on `port`, else on a free port below the ephemeral range: a cut proxy listens
    again on its port after the outage (liyagent/local/servers.py `candidate_ports`)."""
    if port:
        deadline = time.monotonic() + 10  # a closing connection's port comes back in moments
        while True:
            try:
                return socket.create_server((host, port))
            except OSError as e:
                if e.errno != errno.EADDRINUSE or time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
    for candidate in candidate_ports()[:500]:
        try:
            return socket.create_server((host, candidate))
        except OSError as e:
            if e.errno != errno.EADDRINUSE:
                raise
    return socket.create_server((host, 0))
