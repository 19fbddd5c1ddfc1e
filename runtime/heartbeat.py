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
from runtime.presence import Presence

log = structlog.get_logger(__name__)


# Bytes never leave, and writes are never made, within this much of the local lease deadline:
# room for the write itself and for the two clocks (ours, Redis's) running a little apart.
SAFETY_MARGIN_MS = 500


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
    """One held lease, shared by the run's thread and the heartbeat thread.

    `valid_until_ms` is when the lease lapses at the latest, by this process's monotonic clock:
    each renewal moves it to (the moment the renewal was sent + TTL), which is never later than
    Redis's own expiry. It is the send guard's deadline (`http.SendGuard`)."""

    token: Token
    leases: Leases
    valid_until_ms: int
    # This process's presence (None only in tests of the lease alone): while it is down, the
    # lease counts for at most the death watch's grace from the loss, and renewals sent
    # before it came back are not trusted (see presence.py).
    presence: Presence | None = None
    last_progress_ms: int = field(default_factory=monotonic_ms)
    lost_why: str | None = None
    # A boundary renewal is skipped while Redis confirmed the lease less than this long ago
    # (half a heartbeat; 0 renews at every boundary): a fast run costs the heartbeat's one
    # round trip, not one per step.
    fresh_ms: int = 0

    def progress(self) -> None:
        """The run's thread is alive and moving: the heartbeat may keep renewing."""
        self.last_progress_ms = monotonic_ms()

    def renewed(self, started_ms: int) -> None:
        if self.presence is not None and not self.presence.trusts(started_ms):
            return  # sent while (or before) this process was absent: proves nothing
        self.valid_until_ms = max(self.valid_until_ms, started_ms + self.leases.ttl_ms)

    def send_time_left_s(self) -> float:
        """Seconds this attempt may still write or send, by the local clock (no network)."""
        if self.lost_why is not None:
            return 0.0
        until = self.valid_until_ms
        cap = None if self.presence is None else self.presence.cap_ms()
        if cap is not None:
            until = min(until, cap)
        return (until - SAFETY_MARGIN_MS - monotonic_ms()) / 1000

    def why_not(self) -> str:
        why = self.lost_why or "its lease may have lapsed (no renewal reached Redis in time)"
        return f"run {self.token.run_id}: attempt {self.token.attempt} may not send: {why}"

    def check(self) -> None:
        """Raise `LeaseLost` unless the lease is still ours by the local clock. No network:
        called right before every write and every call that leaves the process (I3)."""
        self.progress()
        if self.send_time_left_s() <= 0:
            self.lost_why = self.lost_why or "its local lease deadline passed without a renewal"
            raise LeaseLost(self.token, self.lost_why)

    def renew(self) -> None:
        """Renew now (one Redis round trip, at a step boundary) and raise `LeaseLost` unless the
        lease is still ours. With Redis unreachable, the lease holds until its local deadline.
        Skipped while Redis confirmed the lease within `fresh_ms`: nobody can have claimed it
        since (a claim needs it lapsed, or this process's connections gone, which caps
        `send_time_left_s`), and every write is still fenced by the attempt in Postgres (I3)."""
        self.progress()
        if self.lost_why is not None:
            raise LeaseLost(self.token, self.lost_why)
        started = monotonic_ms()
        # When Redis last confirmed the lease: the deadline is always that moment plus the TTL.
        confirmed_ms = self.valid_until_ms - self.leases.ttl_ms
        if started - confirmed_ms < self.fresh_ms and self.send_time_left_s() > 0:
            return
        try:
            ok = self.leases.renew(self.token)
        except redis.RedisError as exc:
            # Unreachable Redis: the lease is ours only until its local deadline, so this
            # attempt stops writing within one lease of losing Redis.
            if self.send_time_left_s() <= 0:
                self.lost_why = f"Redis unreachable past the lease: {exc}"
                raise LeaseLost(self.token, self.lost_why) from exc
            return
        if not ok:
            self.lost_why = "the lease key is gone or holds another attempt"
            raise LeaseLost(self.token, self.lost_why)
        self.renewed(started)


class Heartbeat:
    """Renews every lease this process holds, about every TTL/3."""

    def __init__(
        self, leases: Leases, interval_ms: int, stall_ms: int, presence: Presence | None = None
    ) -> None:
        self.leases = leases
        self.interval_ms = interval_ms
        self.stall_ms = stall_ms
        self.presence = presence
        self._held: dict[str, RunLease] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._pid = os.getpid()

    def hold(self, token: Token, acquired_ms: int) -> RunLease:
        if self.presence is not None:
            self.presence.start()  # a lease counts only while this process is seen alive
        lease = RunLease(
            token,
            self.leases,
            valid_until_ms=acquired_ms + self.leases.ttl_ms,
            presence=self.presence,
            fresh_ms=self.interval_ms // 2,
        )
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
