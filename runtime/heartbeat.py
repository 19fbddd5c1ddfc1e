"""One heartbeat thread per worker process renews all the process's leases in one round trip.

A lease is renewed only while its run's own thread shows progress: a hung run stops being
renewed, its lease lapses and the sweeper hands it to another worker. A run that learns its
lease is lost stops at its next step (I3).
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass, field

import redis
import structlog

from runtime.leases import Leases, Token, monotonic_ms

log = structlog.get_logger(__name__)


SAFETY_MARGIN_MS = 1000


class LeaseLost(Exception):
    """This attempt no longer holds its run's lease: stop now, write nothing more."""

    def __init__(self, token: Token, why: str) -> None:
        super().__init__(
            f"run {token.run_id}: attempt {token.attempt} lost its lease ({why}); it stops here "
            "and the sweeper resumes the run elsewhere"
        )
        self.token = token


@dataclass
class RunLease:
    """One held lease, shared by the run's thread and the heartbeat thread."""

    token: Token
    leases: Leases
    valid_until_ms: int
    last_progress_ms: int = field(default_factory=monotonic_ms)
    lost_why: str | None = None

    def progress(self) -> None:
        """The run's thread is alive and moving: the heartbeat may keep renewing."""
        self.last_progress_ms = monotonic_ms()

    def renewed(self, started_ms: int) -> None:
        self.valid_until_ms = started_ms + self.leases.ttl_ms

    def ensure(self) -> None:
        """Renew now and raise `LeaseLost` unless the lease is still ours. Called at every step
        boundary, right before every call that leaves the process and every write."""
        self.progress()
        if self.lost_why is not None:
            raise LeaseLost(self.token, self.lost_why)
        started = monotonic_ms()
        try:
            ok = self.leases.renew(self.token)
        except redis.RedisError as exc:
            # Unreachable Redis: the lease is ours only until it would have lapsed, less a
            # margin for the write that follows (measured after the failed call, which can be
            # slow), so this attempt stops writing within one lease of losing Redis.
            if monotonic_ms() < self.valid_until_ms - SAFETY_MARGIN_MS:
                return
            self.lost_why = f"Redis unreachable past the lease: {exc}"
            raise LeaseLost(self.token, self.lost_why) from exc
        if not ok:
            self.lost_why = "the lease key is gone or holds another attempt"
            raise LeaseLost(self.token, self.lost_why)
        self.renewed(started)


class Heartbeat:
    """Renews every lease this process holds, about every TTL/3."""

    def __init__(self, leases: Leases, interval_ms: int, stall_ms: int) -> None:
        self.leases = leases
        self.interval_ms = interval_ms
        self.stall_ms = stall_ms
        self._held: dict[str, RunLease] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._pid = os.getpid()

    def hold(self, token: Token, acquired_ms: int) -> RunLease:
        lease = RunLease(token, self.leases, valid_until_ms=acquired_ms + self.leases.ttl_ms)
        with self._lock:
            self._held[str(token)] = lease
            self._start()
        return lease

    def drop(self, lease: RunLease) -> None:
        with self._lock:
            self._held.pop(str(lease.token), None)

    def _start(self) -> None:
        if self._thread is None or not self._thread.is_alive():
            self._thread = threading.Thread(
                target=self._loop, name="liyagent-heartbeat", daemon=True
            )
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def beat(self) -> None:
        """Renew, in one pipeline, every lease whose run made progress within the stall bound."""
        now = monotonic_ms()
        with self._lock:
            held = list(self._held.values())
        due = [h for h in held if h.lost_why is None and now - h.last_progress_ms < self.stall_ms]
        for h in held:
            if h.lost_why is None and now - h.last_progress_ms >= self.stall_ms:
                log.warning(
                    "lease.stalled_not_renewed",
                    run_id=h.token.run_id,
                    attempt=h.token.attempt,
                    stalled_ms=now - h.last_progress_ms,
                )
        if not due:
            return
        try:
            results = self.leases.renew_many([h.token for h in due])
        except redis.RedisError as exc:
            for h in due:
                if now >= h.valid_until_ms - SAFETY_MARGIN_MS:
                    h.lost_why = f"Redis unreachable past the lease: {exc}"
            log.warning("lease.renew_failed", error=str(exc), leases=len(due))
            return
        for h, ok in zip(due, results, strict=True):
            if ok:
                h.renewed(now)
            else:
                h.lost_why = "the lease key is gone or holds another attempt"
                log.warning("lease.lost", run_id=h.token.run_id, attempt=h.token.attempt)

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_ms / 1000):
            try:
                self.beat()
            except Exception:  # the heartbeat must outlive any one bad renewal
                log.exception("lease.heartbeat_error")
