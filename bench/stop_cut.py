"""Part of `make bench` section `workflows`: how soon a Stop cuts the model request a running
attempt waits on (issue 36: within a second), with the push on (LIYAGENT_STOP_PUSH, the
default) and off (the attempt's heartbeat's next renewal only), in one run.

Method: per side one liyagent worker (`-c 2`) whose model endpoint is the simulators' model
behind a TCP tap in this process: the tap passes bytes both ways and notes, by its own
monotonic clock, when a client's request starts and when the client closes its connection.
Each trial starts a run whose one model step answers after 20 s, waits until the tap has seen
its request, stops the run through the client and takes the time from the Stop to the worker's
close of that connection (the request cut). Trials go one at a time, the two sides in turn.
"""

from __future__ import annotations

import contextlib
import socket
import statistics
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from functools import partial

import structlog

from bench.lab import Lab
from bench.report import Figure, Target
from bench.sides import LiyagentSide
from liyagent.local import sim_model
from liyagent.local.procs import Proc

log = structlog.get_logger(__name__)

# The model's answer would take this long: every cut comes long before it.
ANSWER_MS = 20_000
CUT_S = 1.0


class Tap:
    """A TCP pass-through on a free loopback port to `upstream`, noting per connection when a
    request began (the first client bytes after the last answer) and when the client closed."""

    def __init__(self, upstream: tuple[str, int]) -> None:
        self.upstream = upstream
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = int(self.listener.getsockname()[1])
        self._lock = threading.Lock()
        self.requests: list[tuple[int, float]] = []  # (connection number, when it began)
        self.closed: dict[int, float] = {}  # connection number -> when its client closed
        self._stop = threading.Event()
        threading.Thread(target=self._accept, name="bench-tap", daemon=True).start()

    def _accept(self) -> None:
        n = 0
        while not self._stop.is_set():
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            n += 1
            upstream = socket.create_connection(self.upstream)
            threading.Thread(target=self._pump_in, args=(n, client, upstream), daemon=True).start()
            threading.Thread(target=self._pump_out, args=(upstream, client), daemon=True).start()

    def _pump_in(self, n: int, client: socket.socket, upstream: socket.socket) -> None:
        """Client to upstream; a chunk starting with a method begins a request."""
        with contextlib.suppress(OSError):
            while data := client.recv(65536):
                if data[:5] in (b"POST ", b"GET /"):
                    with self._lock:
                        self.requests.append((n, time.monotonic()))
                upstream.sendall(data)
        with self._lock:
            self.closed.setdefault(n, time.monotonic())
        for s in (client, upstream):
            with contextlib.suppress(OSError):
                s.close()

    @staticmethod
    def _pump_out(upstream: socket.socket, client: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := upstream.recv(65536):
                client.sendall(data)

    def close(self) -> None:
        self._stop.set()
        with contextlib.suppress(OSError):
            self.listener.close()


def _more(seen: list[tuple[int, float]], than: int) -> bool:
    return len(seen) > than


def _until(check: Callable[[], bool], what: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            raise TimeoutError(f"stop bench: {what} did not happen within {timeout_s} s")
        time.sleep(0.005)


def measure_stop_cut(lab: Lab, trials: int, timeout_s: float) -> list[Figure]:
    """The Stop-to-cut figures (see the module docstring), push on and off."""
    host, _, port = lab.sim_url.removeprefix("http://").partition(":")
    tap = Tap((host, int(port.split("/")[0])))
    tap_url = f"http://127.0.0.1:{tap.port}"
    sides: dict[bool, tuple[LiyagentSide, Proc]] = {}
    try:
        for push in (True, False):
            settings = replace(
                lab.settings(lab.database("bench_stops")),
                model_profiles=sim_model.profiles(tap_url),
                stop_push=push,
            )
            [worker] = lab.launch(lab.liyagent(f"stops-{'on' if push else 'off'}", settings))
            sides[push] = (LiyagentSide(settings, lab.seal_keys), worker)
        model = sim_model.register(lab.sim_url, [{"final": "too late", "latency_ms": ANSWER_MS}])
        cuts: dict[bool, list[float]] = {True: [], False: []}
        for _ in range(trials):
            for push, (side, _worker) in sides.items():
                seen = len(tap.requests)
                run_id = str(
                    side.client.start_run(
                        agent="bench-stop", model=model, user_input="wait", tools=[]
                    )
                )
                _until(partial(_more, tap.requests, seen), "the model request", timeout_s)
                conn = tap.requests[-1][0]
                stopped = time.monotonic()
                side.client.stop(run_id=run_id, reason="bench", by="bench")
                _until(partial(tap.closed.__contains__, conn), "the request's cut", timeout_s)
                cuts[push].append(tap.closed[conn] - stopped)
    finally:
        for side, worker in sides.values():
            lab.stop(worker)
            side.close()
        tap.close()
    on, off = (statistics.median(cuts[p]) for p in (True, False))
    return [
        Figure(
            "stop_cut_s",
            f"Stop to the request in flight cut, median of {trials}",
            on,
            "s",
            Target("<=", CUT_S, source="issue 36"),
            digits=3,
        ),
        Figure("stop_cut_max_s", "the same, slowest", max(cuts[True]), "s", digits=3),
        Figure(
            "stop_cut_off_s",
            "the same with LIYAGENT_STOP_PUSH=false (the next renewal), median",
            off,
            "s",
            digits=3,
        ),
    ]
