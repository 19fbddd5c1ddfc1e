"""The send guard, over loopback: a request of an attempt whose lease may be gone never leaves
(not on a new connection, not on a pooled one), a wait for an answer ends when the lease's local
deadline passes (and goes on while it is renewed), and a request never outlives its total
timeout, however slowly the server drips its answer."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler

import httpx
import pytest

from runtime.sending import http
from runtime.sending.call_http import CallHTTP
from tests.support.loopback import serving
from tests.support.stand_in_lease import Lease


@dataclass
class Seen:
    requests: list[str] = field(default_factory=list)
    connections: int = 0


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    seen: Seen

    def setup(self) -> None:
        super().setup()
        self.seen.connections += 1

    def do_GET(self) -> None:
        self.seen.requests.append(self.path)
        if self.path.startswith("/slow/"):
            time.sleep(float(self.path.split("/")[2]))
        if self.path.startswith("/drip"):
            self.send_response(200)
            self.send_header("Content-Length", "40")
            self.end_headers()
            for _ in range(40):
                self.wfile.write(b"x")
                self.wfile.flush()
                time.sleep(0.1)
            return
        body = b'{"ok": true}'
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def server() -> Iterator[tuple[str, Seen]]:
    seen = Seen()
    handler = type("H", (Handler,), {"seen": seen})
    with serving(handler) as url:
        yield url, seen


def _call_http(timeout_s: float = 10.0) -> CallHTTP:
    return CallHTTP.for_call(key="k", run_id="r", attempt=1, call="1:c", timeout_s=timeout_s)


def test_a_lapsed_lease_sends_nothing_not_even_a_connection(server) -> None:
    url, seen = server
    with http.guarded(Lease(until=time.monotonic() - 0.01)), pytest.raises(http.SendRefused):
        _call_http().get(f"{url}/write")
    assert seen.connections == 0 and seen.requests == []


def test_a_pooled_connection_is_checked_too(server) -> None:
    url, seen = server
    lease = Lease(until=time.monotonic() + 30)
    with http.guarded(lease):
        assert _call_http().get(f"{url}/first").status_code == 200
        lease.lost = True  # taken over between two requests on one kept-alive connection
        with pytest.raises(http.SendRefused):
            _call_http().get(f"{url}/second")
    assert seen.requests == ["/first"]


def test_a_wait_for_an_answer_ends_at_the_lease_deadline(server) -> None:
    url, _ = server
    started = time.monotonic()
    with http.guarded(Lease(until=time.monotonic() + 0.5)), pytest.raises(httpx.ReadTimeout) as e:
        _call_http(timeout_s=10).get(f"{url}/slow/3")
    assert time.monotonic() - started < 1.5
    assert "abandoned" in str(e.value)


def test_a_renewed_lease_lets_a_long_answer_come(server) -> None:
    url, _ = server
    lease = Lease(until=time.monotonic() + 0.4)
    stop = threading.Event()

    def heartbeat() -> None:  # renews every 0.15 s, each time for 0.4 s more
        while not stop.wait(0.15):
            lease.until = time.monotonic() + 0.4

    beat = threading.Thread(target=heartbeat, daemon=True)
    beat.start()
    try:
        with http.guarded(lease):
            assert _call_http(timeout_s=10).get(f"{url}/slow/1.5").json() == {"ok": True}
    finally:
        stop.set()


def test_a_dripping_answer_never_outlives_the_total_timeout(server) -> None:
    url, _ = server
    started = time.monotonic()
    with pytest.raises(httpx.ReadTimeout):
        # Each byte comes well within any per-read timeout; the whole answer takes 4 s.
        _call_http(timeout_s=1.0).get(f"{url}/drip")
    assert time.monotonic() - started < 2.0


def test_without_a_guard_requests_go_with_timeouts_only(server) -> None:
    url, seen = server
    assert _call_http().get(f"{url}/free").status_code == 200
    assert seen.requests == ["/free"]


def test_a_request_leaves_whole_or_not_at_all() -> None:
    """A process paused between a request's head and its body (here: its lease lost while
    the body is produced) sends nothing, not a head without its body: the server's socket
    receives no byte. A complete request arrives in one segment's worth of writes."""
    received: list[bytes] = []
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(10)

    def serve() -> None:
        for _ in range(2):
            conn, _ = listener.accept()
            conn.settimeout(10)
            data = b""
            with conn:
                while chunk := conn.recv(65536):
                    data += chunk
                    if data.endswith(b"helloworld"):
                        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
            received.append(data)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{listener.getsockname()[1]}/incidents"
    lease = Lease(until=time.monotonic() + 30)

    def body() -> Iterator[bytes]:
        yield b"hello"
        lease.lost = True  # taken over while the body is being written
        yield b"world"

    headers = {"Content-Length": "10", "Connection": "close"}
    with http.guarded(lease), pytest.raises(http.SendRefused):
        _call_http().post(url, content=body(), headers=headers)
    lease.lost = False
    with http.guarded(lease):
        assert _call_http().post(url, content=b"helloworld", headers=headers).status_code == 200
    thread.join(timeout=10)
    listener.close()
    assert received[0] == b"", received[0][:200]  # nothing of the refused request arrived
    assert received[1].startswith(b"POST /incidents") and received[1].endswith(b"helloworld")


class CookieSetter(BaseHTTPRequestHandler):
    """Sets a session cookie on /login; records the Cookie header every request came with."""

    protocol_version = "HTTP/1.1"
    cookies: list[str | None]

    def do_GET(self) -> None:
        self.cookies.append(self.headers.get("Cookie"))
        self.send_response(200)
        if self.path == "/login":
            self.send_header("Set-Cookie", "session=tenant-a; Path=/")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:
        pass


def test_a_cookie_one_call_was_given_never_rides_on_another_calls_request() -> None:
    """The pooled clients serve every run of the process: a vendor's session cookie set on one
    run's call must not be sent with the next run's requests (sync and async alike)."""
    cookies: list[str | None] = []
    handler = type("C", (CookieSetter,), {"cookies": cookies})
    with serving(handler) as url:

        def call(run: str) -> CallHTTP:
            return CallHTTP.for_call(key=run, run_id=run, attempt=1, call="1:c", timeout_s=5)

        assert call("run-a").get(f"{url}/login").headers["set-cookie"].startswith("session=")
        assert call("run-b").get(f"{url}/next").status_code == 200

        async def async_calls() -> None:
            await call("run-c").aget(f"{url}/login")
            await call("run-d").aget(f"{url}/next")
            # This loop ends with asyncio.run: its pooled connections go with it.
            await http.shared_async_client().aclose()

        asyncio.run(async_calls())
    assert cookies == [None, None, None, None]


class KeyRecorder(BaseHTTPRequestHandler):
    """Records every Idempotency-Key header each request came with."""

    protocol_version = "HTTP/1.1"
    keys: list[list[str]]

    def do_GET(self) -> None:
        self.keys.append(self.headers.get_all("Idempotency-Key") or [])
        self.send_response(204)
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:
        pass


def test_the_calls_step_key_is_the_one_idempotency_key_sent() -> None:
    """A tool (or a team's client through CallTransport) that sets an idempotency key of its own,
    in whatever case, sends one key: the step's (I8), never two for the vendor to pick from."""
    keys: list[list[str]] = []
    handler = type("K", (KeyRecorder,), {"keys": keys})
    with serving(handler) as url:
        call = CallHTTP.for_call(key="step-key", run_id="r", attempt=1, call="1:c", timeout_s=5)
        call.get(url, headers={"idempotency-key": "the-tools-own"})
        call.get(url, headers={"Idempotency-Key": "the-tools-own"})
        call.get(url)
    assert keys == [["step-key"], ["step-key"], ["step-key"]]
