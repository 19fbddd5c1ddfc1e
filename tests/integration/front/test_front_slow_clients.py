"""The front under slow clients, for real: `python -m front` as a process with a lowered file
descriptor limit, hundreds of raw loopback sockets that send part of a request and stall. The
slow ones are closed within the head (or body) bound, `/healthz` answers throughout, and the
log holds one summarised refusal line per interval, never a line or a traceback per
connection."""

from __future__ import annotations

import json
import selectors
import socket
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from liyagent.local.procs import Proc, python
from tests.support.front import AUTH, TOKEN

# The front's file descriptor limit (soft and hard), well under the slow sockets opened.
FD_LIMIT = 256
SLOW = 400
HEAD_S, BODY_S, REFUSAL_S = 2, 3, 2
# How late past its bound a slow connection may still be open (a loaded 2-core machine).
SLACK_S = 3.0
# Sets the limit, then runs the front as `python -m front` would (argv: limit, front args).
LIMITED = (
    "import resource, sys; n = int(sys.argv[1]); "
    "resource.setrlimit(resource.RLIMIT_NOFILE, (n, n)); "
    "from front.__main__ import main; sys.exit(main(sys.argv[2:]))"
)
REFUSED_EVENT = "front.connections_refused"


@pytest.fixture
def agents_file(tmp_path: Path) -> str:
    path = tmp_path / "agents.json"
    steps = {"steps": [{"final": "ok"}]}
    path.write_text(
        json.dumps({"agents": {"reader": {"model": {"provider": "scripted", "script": steps}}}})
    )
    return str(path)


def _front(stack, agents_file: str, tmp_path: Path, **extra: str) -> tuple[Proc, str]:
    env = {
        **stack.env,
        "LIYAGENT_FRONT_TOKEN": TOKEN,
        "LIYAGENT_AGENTS_FILE": agents_file,
        "LIYAGENT_FRONT_HEAD_TIMEOUT_S": str(HEAD_S),
        "LIYAGENT_FRONT_BODY_TIMEOUT_S": str(BODY_S),
        "LIYAGENT_FRONT_REFUSAL_LOG_S": str(REFUSAL_S),
        **extra,
    }
    argv = python("-c", LIMITED, str(FD_LIMIT), "--port", "0")
    proc = Proc("front", argv, env, tmp_path / "front.log")
    stack.procs.append(proc)
    url = proc.wait_for(r"front listening on (http://\S+)", timeout=30).group(1)
    return proc, url


def _address(url: str) -> tuple[str, int]:
    host, port = url.removeprefix("http://").rsplit(":", 1)
    return host, int(port)


class Probe(threading.Thread):
    """GET /healthz on a fresh connection every 0.2 s until stopped; keeps every outcome."""

    def __init__(self, url: str) -> None:
        super().__init__(daemon=True)
        self.url = url
        self.outcomes: list[str] = []
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.is_set():
            try:
                answer = httpx.get(f"{self.url}/healthz", timeout=3)
                self.outcomes.append(str(answer.status_code))
            except httpx.HTTPError as exc:
                self.outcomes.append(type(exc).__name__)
            self.done.wait(0.2)


def _stall(address: tuple[str, int], payload: bytes) -> socket.socket:
    sock = socket.create_connection(address, timeout=10)
    sock.sendall(payload)
    sock.setblocking(False)
    return sock


def _closed_within(socks: dict[socket.socket, float], bound_s: float) -> dict[str, list[float]]:
    """Wait (at most `bound_s` past the last one opened) for the front to close each socket;
    returns how long each lived, by what it read ("408" if a 408 came first, else "closed"),
    and "open" for those still open at the end."""
    lived: dict[str, list[float]] = {"408": [], "closed": [], "open": []}
    seen: dict[socket.socket, bytes] = {s: b"" for s in socks}
    deadline = max(socks.values()) + bound_s
    with selectors.DefaultSelector() as sel:
        for sock in socks:
            sel.register(sock, selectors.EVENT_READ)
        while seen and time.monotonic() < deadline:
            for key, _ in sel.select(timeout=max(0.0, deadline - time.monotonic())):
                sock = key.fileobj
                assert isinstance(sock, socket.socket)
                try:
                    data = sock.recv(4096)
                except ConnectionError:
                    data = b""
                if data:
                    seen[sock] += data
                    continue
                how = "408" if seen[sock].startswith(b"HTTP/1.1 408") else "closed"
                lived[how].append(time.monotonic() - socks[sock])
                sel.unregister(sock)
                del seen[sock]
    lived["open"] = [time.monotonic() - socks[s] for s in seen]
    for sock in socks:
        sock.close()
    return lived


def _refusal_lines(log: str) -> list[dict[str, Any]]:
    lines = [json.loads(x) for x in log.splitlines() if x.startswith("{")]
    return [x for x in lines if x.get("event") == REFUSED_EVENT]


def _refused(lines: list[dict[str, Any]], *reasons: str) -> int:
    return sum(int(x.get(reason, 0)) for x in lines for reason in reasons)


def test_slow_heads_are_shed_and_closed_while_healthz_answers(stack, agents_file, tmp_path):
    front, url = _front(stack, agents_file, tmp_path)
    address = _address(url)
    probe = Probe(url)
    probe.start()
    started = time.monotonic()
    try:
        socks = {}
        for i in range(SLOW):
            socks[_stall(address, b"GET /healthz HT" if i % 2 else b"")] = time.monotonic()
        lived = _closed_within(socks, HEAD_S + SLACK_S)
        time.sleep(0.5)
    finally:
        probe.done.set()
        probe.join(timeout=10)
    assert lived["open"] == [], f"{len(lived['open'])} slow connections still open"
    assert len(lived["408"]) + len(lived["closed"]) == SLOW
    assert max(lived["408"] + lived["closed"]) < HEAD_S + SLACK_S
    assert len(probe.outcomes) >= 5 and set(probe.outcomes) == {"200"}, probe.outcomes
    assert front.alive()
    assert httpx.get(f"{url}/healthz", timeout=5).status_code == 200

    time.sleep(REFUSAL_S + 1)  # the last interval's line is written
    elapsed = time.monotonic() - started
    log = front.output()
    lines = _refusal_lines(log)
    assert 1 <= len(lines) <= elapsed / REFUSAL_S + 1, lines
    assert _refused(lines, "shed", "head_timeout") >= SLOW, lines
    assert "Traceback" not in log and "Too many open files" not in log
    assert len(log) < 64 * 1024, f"the front wrote {len(log)} bytes of log"


def test_a_slow_head_or_body_is_answered_408_and_closed(stack, agents_file, tmp_path):
    front, url = _front(stack, agents_file, tmp_path)
    address = _address(url)
    head = (
        "POST /webhooks/reader HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        f"Authorization: Bearer {TOKEN}\r\nContent-Length: 100\r\n\r\n"
    ).encode()
    trickle = _stall(address, b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
    socks = {
        _stall(address, b"GET /healthz HTTP/1.1\r\nHo"): time.monotonic(),
        _stall(address, head + b'{"event_id": "e1", '): time.monotonic(),
        trickle: time.monotonic(),
    }
    opened = time.monotonic()
    for _ in range(int(HEAD_S / 0.5) + 2):  # a header a half-second never completes the head
        time.sleep(0.5)
        try:
            trickle.send(b"X-A: b\r\n")
        except OSError:
            break
    lived = _closed_within(socks, BODY_S + SLACK_S)
    assert lived["open"] == [] and len(lived["408"]) == 3, lived
    assert max(lived["408"]) < BODY_S + SLACK_S
    assert time.monotonic() - opened < BODY_S + SLACK_S + 1
    assert stack.rows("SELECT count(*) AS n FROM runs")[0].n == 0
    time.sleep(REFUSAL_S + 1)
    log = front.output()
    lines = _refusal_lines(log)
    assert _refused(lines, "head_timeout") == 2 and _refused(lines, "body_timeout") == 1, lines
    assert "Traceback" not in log and "front.failed" not in log
    assert httpx.get(f"{url}/healthz", timeout=5).status_code == 200


def _answer_head(sock: socket.socket, timeout_s: float = 10.0) -> bytes:
    """The first bytes the front sends on `sock` (b"" if it closed without a word)."""
    sock.setblocking(True)
    sock.settimeout(timeout_s)
    try:
        return sock.recv(4096)
    except ConnectionError:
        return b""


def test_at_the_cap_with_every_connection_served_a_new_one_is_answered_503(
    stack, agents_file, tmp_path
):
    front, url = _front(stack, agents_file, tmp_path, LIYAGENT_FRONT_MAX_CONNECTIONS="8")
    address = _address(url)
    run_id = httpx.post(
        f"{url}/webhooks/reader", json={"event_id": "e1", "input": "hi"}, headers=AUTH, timeout=10
    ).json()["run_id"]  # queued (no worker): its event stream stays open
    follow = (
        f"GET /runs/{run_id}/events HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}\r\n\r\n"
    ).encode()
    streams = [_stall(address, follow) for _ in range(8)]
    assert all(_answer_head(s).startswith(b"HTTP/1.1 200") for s in streams)
    # Nothing waits on its client, so nothing can be shed: a newcomer is told, not left hanging.
    late = _stall(address, b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
    assert _answer_head(late).startswith(b"HTTP/1.1 503"), "the ninth connection was served"
    late.close()
    for sock in streams[:2]:
        sock.close()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if httpx.get(f"{url}/healthz", timeout=5).status_code == 200:
            break
        time.sleep(0.2)
    else:
        raise AssertionError("/healthz never answered again once streams closed")
    for sock in streams[2:]:
        sock.close()
    time.sleep(REFUSAL_S + 1)
    lines = _refusal_lines(front.output())
    assert _refused(lines, "full") >= 1 and _refused(lines, "shed") == 0, lines
