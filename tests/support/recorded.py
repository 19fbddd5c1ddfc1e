"""Recorded model responses served over loopback: a real HTTP server that answers requests
with fixture files in order and keeps every request it received (the judge of what a provider
sent, and of how often a model step was asked)."""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx

from runtime.durable.state import RunState
from runtime.models.base import StepRequest

# What both providers' recorded conversations are about: a ticket read, then this answer.
FINAL = "Ticket T-1 is open with priority p2."
TICKET_TOOL: dict[str, Any] = {
    "name": "ticket.read",
    "description": "Read a ticket by id.",
    "parameters": {
        "type": "object",
        "properties": {"ticket": {"type": "string"}},
        "required": ["ticket"],
    },
}


def first_step() -> StepRequest:
    """Step 1 of a run asking about T-1, with the ticket tool offered."""
    state = RunState.initial("rec", "You are a support agent.", "What is T-1's priority?")
    return StepRequest("run-1", 1, 1, state.messages, [TICKET_TOOL])


# Answered once the recorded replies run out: a 410 is never retried, so an unexpected extra
# request fails its run visibly.
NO_REPLY_LEFT = b'{"type": "error", "error": {"type": "gone", "message": "no recorded reply left"}}'


@dataclass(frozen=True)
class Reply:
    """One recorded response: its status, headers, fixture body and how long to stall first."""

    fixture: str
    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)
    delay_s: float = 0.0


@dataclass(frozen=True)
class Received:
    path: str
    headers: httpx.Headers  # case-insensitive, as HTTP headers are
    body: dict[str, Any]


class RecordedServer:
    """A real HTTP server on a free loopback port: serves replies in order, keeps each request."""

    def __init__(self, fixtures: Path, replies: list[Reply], prefix: str = "") -> None:
        self.fixtures = fixtures
        self.prefix = prefix
        self.replies = list(replies)
        self.received: list[Received] = []
        self.lock = threading.Lock()
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}{self.prefix}"

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(timeout=5)

    def requests_of(self, run_id: str) -> list[tuple[int, int, int]]:
        """(step, attempt, requests) as the server received them for a run."""
        counts: dict[tuple[int, int], int] = {}
        for got in self.received:
            if got.headers.get("X-Liyagent-Run") == run_id:
                key = (int(got.headers["X-Liyagent-Step"]), int(got.headers["X-Liyagent-Attempt"]))
                counts[key] = counts.get(key, 0) + 1
        return [(step, attempt, n) for (step, attempt), n in sorted(counts.items())]

    def _next(self, received: Received) -> tuple[Reply | None, bytes]:
        with self.lock:
            self.received.append(received)
            if not self.replies:
                return None, NO_REPLY_LEFT
            reply = self.replies.pop(0)
        return reply, (self.fixtures / f"{reply.fixture}.json").read_bytes()

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                raw = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                received = Received(self.path, httpx.Headers(self.headers.items()), json.loads(raw))
                reply, body = server._next(received)
                if reply is not None:
                    time.sleep(reply.delay_s)
                try:
                    self.send_response(410 if reply is None else reply.status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(body)))
                    for name, value in (reply.headers if reply else {}).items():
                        self.send_header(name, value)
                    self.end_headers()
                    self.wfile.write(body)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up (a timeout test): nobody is left to answer

            def log_message(self, format: str, *args: Any) -> None:
                pass  # keep the test output to the assertions

        return Handler


@contextlib.contextmanager
def recorded_servers(fixtures: Path, prefix: str = "") -> Iterator[Callable[..., RecordedServer]]:
    """A factory of recorded servers for one test; all are closed after it."""
    servers: list[RecordedServer] = []

    def start(*replies: Reply) -> RecordedServer:
        server = RecordedServer(fixtures, list(replies), prefix)
        servers.append(server)
        return server

    try:
        yield start
    finally:
        for server in servers:
            server.close()
