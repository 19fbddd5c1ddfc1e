"""The vendor simulators' HTTP server: one threaded loopback server for every vendor.

Each request is answered and recorded in one Postgres transaction, committed before the answer
is sent (and before any ``X-Sim-Delay-Ms`` pause), so the vendor's records are the ground truth.
"""

from __future__ import annotations

import json
import logging
import socketserver
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from sqlalchemy import Engine

from simulators import records, routes, store, wire
from simulators.logs import log_event
from simulators.records import (
    a2a_tasks_by_id,
    chat_replies_by_key,
    comments_by_key,
    connector_posts_by_key,
    count_requests,
    fine_tunes_by_key,
    incidents_by_key,
    notifications_by_key,
)
from simulators.routes import source_doc
from simulators.store import ensure_schema, make_engine
from simulators.wire import (
    DEFAULT_NOTIFY_DEDUPE_S,
    DEFAULT_SOURCE_DOCS,
    HttpError,
    Request,
    Response,
)

__all__ = [
    "DEFAULT_INCIDENT_DEDUPE_S",
    "DEFAULT_NOTIFY_DEDUPE_S",
    "DEFAULT_SOURCE_DOCS",
    "SimulatorServer",
    "a2a_tasks_by_id",
    "chat_replies_by_key",
    "comments_by_key",
    "connector_posts_by_key",
    "count_requests",
    "ensure_schema",
    "fine_tunes_by_key",
    "incidents_by_key",
    "make_engine",
    "notifications_by_key",
    "serve",
    "source_doc",
    "stop",
]

DEFAULT_INCIDENT_DEDUPE_S = 86400.0
MAX_BODY_BYTES = 1 << 20
IDLE_TIMEOUT_S = 120.0


class SimulatorHandler(BaseHTTPRequestHandler):
    """Turns each HTTP request, whatever its method, into one recorded JSON answer."""

    server: SimulatorServer
    protocol_version = "HTTP/1.1"
    server_version = "liyagent-simulators/1"
    timeout = IDLE_TIMEOUT_S
    # The status line and headers go out in one write and the body in another: without
    # TCP_NODELAY, Nagle holds the body until the client's delayed ACK (~40 ms a request).
    disable_nagle_algorithm = True

    def __getattr__(self, name: str) -> Callable[[], None]:
        """Route every ``do_<METHOD>`` here, so even unknown methods are answered and recorded."""
        if name.startswith("do_"):
            return self._handle
        raise AttributeError(name)

    def _handle(self) -> None:
        """Parse, answer and record the request, pause if asked, then send the answer."""
        raw, transport_error = self._read_body()
        headers = {name.lower(): value for name, value in self.headers.items()}
        request = wire.parse_request(self.command, self.path, headers, raw, transport_error)
        response = self.server.execute(request)
        delay_ms = max(request.delay_ms, response.delay_ms)
        if delay_ms:
            time.sleep(delay_ms / 1000)
        self._send(response)

    def _read_body(self) -> tuple[bytes, HttpError | None]:
        """Read the body by Content-Length; a body we cannot read ends the connection."""
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            self.close_connection = True
            return b"", HttpError(411, "chunked bodies are not supported: send Content-Length")
        raw_length = self.headers.get("Content-Length", "").strip() or "0"
        if not raw_length.isdecimal():
            self.close_connection = True
            return b"", HttpError(400, "header Content-Length must be a non-negative integer")
        length = int(raw_length)
        if length > MAX_BODY_BYTES:
            self.close_connection = True
            return b"", HttpError(413, f"request body exceeds {MAX_BODY_BYTES} bytes")
        return self.rfile.read(length), None

    def _send(self, response: Response) -> None:
        """Write the JSON answer; a client that has already gone is logged, not raised."""
        data = json.dumps(response.payload).encode()
        try:
            self.send_response(response.status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            for name, value in response.headers.items():
                self.send_header(name, value)
            if self.close_connection:
                self.send_header("Connection", "close")
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(data)
        except OSError as exc:
            self.close_connection = True
            log_event(logging.DEBUG, "client_gone", method=self.command, error=repr(exc))

    def log_message(self, format: str, *args: Any) -> None:
        """Access and protocol messages go to debug: no per-request noise by default."""
        log_event(logging.DEBUG, "http", client=self.client_address[0], message=format % args)


class SimulatorServer(ThreadingHTTPServer):
    """Threaded HTTP server owning the database engine, the dedupe windows and the corpus size."""

    daemon_threads = True
    # socketserver listens with a backlog of 5: a burst of new connections (a worker's hundreds
    # of threads resuming at once) overflows it, and each dropped SYN costs the client a 1, 3,
    # 7... s retransmit, long enough to time a model call out. Real services listen with
    # hundreds (nginx 511, uvicorn 2048).
    request_queue_size = 1024

    def __init__(
        self,
        address: tuple[str, int],
        engine: Engine,
        incident_dedupe_s: float,
        notify_dedupe_s: float = DEFAULT_NOTIFY_DEDUPE_S,
        source_docs: int = DEFAULT_SOURCE_DOCS,
    ) -> None:
        self.engine = engine
        self.incident_dedupe_s = incident_dedupe_s
        self.notify_dedupe_s = notify_dedupe_s
        self.source_docs = source_docs
        self._tx_engine = store.transactional(engine)
        super().__init__(address, SimulatorHandler)

    def server_bind(self) -> None:
        """Bind without HTTPServer's reverse-DNS lookup of the host, which can stall a start."""
        socketserver.TCPServer.server_bind(self)
        host, port = self.socket.getsockname()[:2]
        self.server_name, self.server_port = str(host), int(port)

    @property
    def url(self) -> str:
        """The base URL clients use, with the port actually bound (``--port 0``)."""
        return f"http://{self.server_name}:{self.server_port}"

    def execute(self, request: Request) -> Response:
        """Answer and record ``request`` in one transaction; 500 (still recorded) on failure."""
        try:
            with self._tx_engine.begin() as conn:
                response = routes.respond(
                    conn, request, self.incident_dedupe_s, self.notify_dedupe_s, self.source_docs
                )
                records.record_request(conn, wire.record_of(request, response))
            return response
        except Exception:
            log_event(logging.ERROR, "request_failed", exc_info=True, path=request.target)
        response = Response(500, {"error": "simulator internal error"})
        self._record_alone(request, response)
        return response

    def _record_alone(self, request: Request, response: Response) -> None:
        """Record a request whose own transaction failed, so it is still counted if possible."""
        try:
            with self._tx_engine.begin() as conn:
                records.record_request(conn, wire.record_of(request, response))
        except Exception:
            log_event(logging.ERROR, "record_failed", exc_info=True, path=request.target)

    def handle_error(self, request: Any, client_address: Any) -> None:
        """Log a crashed handler in the structured log instead of a bare traceback."""
        log_event(logging.ERROR, "handler_crashed", exc_info=True, client=str(client_address))

    def server_close(self) -> None:
        """Close the listening socket and the database pool."""
        super().server_close()
        self.engine.dispose()


def serve(
    host: str,
    port: int,
    database_url: str,
    incident_dedupe_s: float = DEFAULT_INCIDENT_DEDUPE_S,
    *,
    notify_dedupe_s: float = DEFAULT_NOTIFY_DEDUPE_S,
    source_docs: int = DEFAULT_SOURCE_DOCS,
) -> tuple[SimulatorServer, threading.Thread]:
    """Create the schema, bind ``host:port`` (0 picks a free port) and serve in a thread."""
    if source_docs < 0:
        raise ValueError(f"source_docs must be >= 0, got {source_docs}")
    engine = make_engine(database_url)
    try:
        ensure_schema(engine)
        server = SimulatorServer(
            (host, port), engine, incident_dedupe_s, notify_dedupe_s, source_docs
        )
    except BaseException:
        engine.dispose()
        raise
    thread = threading.Thread(target=server.serve_forever, name="simulators-http", daemon=True)
    thread.start()
    log_event(
        logging.INFO,
        "listening",
        url=server.url,
        incident_dedupe_s=incident_dedupe_s,
        notify_dedupe_s=notify_dedupe_s,
        source_docs=source_docs,
    )
    return server, thread


def stop(server: SimulatorServer, thread: threading.Thread, timeout_s: float = 10.0) -> None:
    """Stop serving, close the socket and the pool, and wait for the serving thread."""
    server.shutdown()
    server.server_close()
    thread.join(timeout_s)
    log_event(logging.INFO, "stopped", url=server.url)
