"""Limits the whole fleet keeps to on a model endpoint (issue 33, item 2): requests, input and
output tokens per minute, and requests in flight, as its model profile declares (`limits`).

One atomic script per model request (`lua/admit.lua`), and only for a profile that declares
limits (any other endpoint costs no Redis round trip): it admits the request, taking its
estimates from continuously refilled token buckets and putting it in flight (an entry that
expires after the model timeout, so a worker killed mid-request leaks nothing), or answers how
many ms to wait for the scarcest dimension, taking nothing. The same call settles this
process's earlier requests on that endpoint: their in-flight entries removed and their token
estimates corrected by their responses' usage, carried as its arguments. Settlements a process
has no further request to carry are flushed by a timer thread, at most every FLUSH_S, never on
a step's path.

Estimates: a request's input tokens are the bytes of its messages (JSON) / 4, the usual rule of
thumb for English text; its output tokens are the run's max_tokens, else its profile's, else
DEFAULT_OUTPUT_TOKENS. The usage a response reports corrects both.

Redis out of reach: requests are admitted (fail open, said once per outage). The buckets lost
with Redis start full again: a moment of over-admission (a 429 closes the endpoint then), never
a run lost.
"""

from __future__ import annotations

import json
import threading
import uuid
from dataclasses import dataclass
from importlib.resources import files
from typing import Any

import redis
import structlog

from runtime.base import process
from runtime.base.logs import SaidOnce
from runtime.base.tenancy import OTHER
from runtime.models.base import Usage
from runtime.models.profiles import EndpointLimits

log = structlog.get_logger(__name__)

# A request's output estimate when neither its run nor its profile names a max_tokens.
DEFAULT_OUTPUT_TOKENS = 1_024
# How long a request's in-flight entry lives when neither its spec nor its profile names a
# timeout: the longest provider default (runtime/models/anthropic.py).
MODEL_TIMEOUT_MS = 60_000
# Bytes of messages per input token, estimated.
BYTES_PER_TOKEN = 4
# How often pending settlements are flushed when no request carries them.
FLUSH_S = 0.2
# When only the in-flight limit is full: ask again after this long (or when its first entry
# expires, if sooner).
IN_FLIGHT_RETRY_MS = 200
# The keys live this long past their last use: two minutes (a bucket is full after one).
TTL_MS = 120_000


def limits_key(namespace: str, profile: str) -> str:
    """One endpoint's token buckets (runtime/fleet/keyspace.py)."""
    return f"{namespace}flow:limits:{profile}"


def in_flight_key(namespace: str, profile: str) -> str:
    """One endpoint's requests in flight (runtime/fleet/keyspace.py)."""
    return f"{namespace}flow:in_flight:{profile}"


def stats_key(namespace: str) -> str:
    """The deployment's flow counters, field `<counter>:<profile>` (runtime/fleet/keyspace.py):
    counted by the scripts that run anyway (admit, close), read by the metrics."""
    return f"{namespace}flow:stats"


def input_estimate(messages: list[Any]) -> int:
    """A request's input tokens, estimated before it is asked: bytes of its messages / 4."""
    size = len(json.dumps(messages, default=str).encode())
    return max(1, size // BYTES_PER_TOKEN)


@dataclass(frozen=True)
class Admission:
    """A request admitted (`wait_ms` 0, `request_id` to settle it by) or asked to wait
    `wait_ms` for `scarcest` (`requests`, `input_tokens`, `output_tokens`, `in_flight`)."""

    wait_ms: int
    scarcest: str
    request_id: str
    input_tokens: int = 0
    output_tokens: int = 0


class Limiter:
    """This process's side of the fleet's limits: the admit script, and the settlements it
    carries (per endpoint) until its next request there, or the flush timer, sends them."""

    def __init__(self, client: redis.Redis[bytes], namespace: str) -> None:
        self.client = client
        self.namespace = namespace
        self.script = client.register_script((files("runtime.flow") / "lua/admit.lua").read_text())
        self.flush_s = FLUSH_S
        self.in_child()
        # A forked child drops its parent's settlements and timer (runtime/base/process.py).
        process.track("runtime.flow.limits", "Limiter", self)

    def in_child(self) -> None:
        """Start with no settlements and no timer (at first, and in a forked child)."""
        self._lock = threading.Lock()
        # profile -> (limits, pending settlements: request id, input and output corrections)
        self._pending: dict[str, tuple[EndpointLimits, list[tuple[str, int, int]]]] = {}
        self._timer: threading.Thread | None = None
        self._outage = SaidOnce(log, "flow.limits_unreachable", "flow.limits_reached")

    def admit(
        self,
        profile: str,
        limits: EndpointLimits,
        inputs: int,
        outputs: int,
        expiry_ms: int,
        *,
        suspend_above_ms: int = -1,
        count_wait: bool = True,
        tenant: str = OTHER,
    ) -> Admission:
        """Ask the fleet's limits for one request to `profile` (one script call, which carries
        this process's pending settlements on it too, and counts the request admitted, or the
        wait it is answered: suspended when above `suspend_above_ms` (-1: never), else in place
        unless `count_wait` is False, a wait already counted), for `tenant` (its label)."""
        request_id = uuid.uuid4().hex
        settled = self._take(profile)
        args = [request_id, *_caps(limits), inputs, outputs, max(1, expiry_ms), TTL_MS]
        counting = [suspend_above_ms, 1 if count_wait else 0]
        try:
            wait, scarcest = self._run(profile, args, settled, counting, tenant)
        except redis.RedisError as exc:
            self._lost(exc)
            return Admission(0, "", "")
        return Admission(int(wait), _text(scarcest), request_id, inputs, outputs)

    def settle(
        self, profile: str, limits: EndpointLimits, admitted: Admission, usage: Usage | None
    ) -> None:
        """`admitted` is answered (or failed): out of flight, its estimates corrected by
        `usage` (none: the estimates stand), at this process's next request or flush."""
        if not admitted.request_id:
            return
        fix_in = 0 if usage is None else usage.input_tokens - admitted.input_tokens
        fix_out = 0 if usage is None else usage.output_tokens - admitted.output_tokens
        with self._lock:
            _, pending = self._pending.get(profile, (limits, []))
            pending.append((admitted.request_id, fix_in, fix_out))
            self._pending[profile] = (limits, pending)
            if self._timer is None:
                self._timer = threading.Thread(
                    target=self._flusher, name="liyagent-flow-limits", daemon=True
                )
                self._timer.start()

    def flush(self) -> None:
        """Send every pending settlement now (one script call per endpoint)."""
        with self._lock:
            found = list(self._pending.items())
            self._pending.clear()
        for profile, (limits, settled) in found:
            try:
                self._run(profile, ["", *_caps(limits), 0, 0, 1, TTL_MS], settled, [-1, 0])
            except redis.RedisError as exc:
                self._lost(exc)  # lost: the in-flight entries expire, the buckets refill

    def _run(
        self,
        profile: str,
        args: list[Any],
        settled: list[tuple[str, int, int]],
        counting: list[int],
        tenant: str = OTHER,
    ) -> Any:
        ns = self.namespace
        keys = [limits_key(ns, profile), in_flight_key(ns, profile), stats_key(ns)]
        args = [*args, IN_FLIGHT_RETRY_MS, f"{profile}:{tenant}", *counting, len(settled)]
        for entry in settled:
            args.extend(entry)
        answer = self.script(keys=keys, args=args)
        self._reached()
        return answer

    def _take(self, profile: str) -> list[tuple[str, int, int]]:
        with self._lock:
            found = self._pending.pop(profile, None)
        return [] if found is None else found[1]

    def _flusher(self) -> None:
        """The timer: flush what is pending, at most every `flush_s`, until nothing is."""
        while True:
            threading.Event().wait(self.flush_s)
            self.flush()
            with self._lock:
                if not self._pending:
                    self._timer = None
                    return

    def _lost(self, exc: Exception) -> None:
        """Said once per outage: requests are admitted until Redis answers again."""
        self._outage.lost(error=str(exc), admits=True)

    def _reached(self) -> None:
        self._outage.reached()


def _caps(limits: EndpointLimits) -> list[int]:
    """The script's limits: requests, input, output tokens per minute, in flight (0: none)."""
    return [
        limits.requests_per_minute or 0,
        limits.input_tokens_per_minute or 0,
        limits.output_tokens_per_minute or 0,
        limits.in_flight or 0,
    ]


def _text(raw: bytes | str) -> str:
    return raw.decode() if isinstance(raw, bytes) else raw
