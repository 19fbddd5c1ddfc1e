"""The sweeper: claims each run whose lease lapsed, once per loss, and republishes stale work.

It runs every few seconds from beat under a Redis lock (two beats are harmless); the claim in
Postgres is the real guard: one conditional update per lapsed run, of two sweeps one wins (I4).
Lapsed leases are found through the deadline index; a periodic full reconcile (and one after
Redis loses its data) also finds running runs that hold no lease at all.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import redis
import structlog

from runtime.leases import Token
from runtime.services import Services
from store.runs import attempt_statuses, claim_lost_many, select_live, touch_stale_queued
from store.waits import wake_ready

log = structlog.get_logger(__name__)

# Run messages delivered between the first and the second number of seconds ago and not yet
# acknowledged, as (run id, attempt): what the broker holds for workers (tasks/deliveries.py).
Deliveries = Callable[[float, float], list[tuple[str, int]]]


@dataclass
class SweepReport:
    ran: bool = True
    full_scan: bool = False
    claimed: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    republished: list[str] = field(default_factory=list)
    duration_ms: float = 0.0

    def to_json(self) -> dict[str, object]:
        return {
            "ran": self.ran,
            "full_scan": self.full_scan,
            "claimed": self.claimed,
            "failed": self.failed,
            "republished": self.republished,
            "duration_ms": round(self.duration_ms, 2),
        }


class Sweeper:
    def __init__(self, services: Services, deliveries: Deliveries | None = None) -> None:
        self.s = services
        self.deliveries = deliveries
        ns = services.settings.namespace
        self.lock_key = f"{ns}sweeper:lock"
        self.count_key = f"{ns}sweeper:count"
        self.epoch_key = f"{ns}sweeper:epoch"

    def sweep(self) -> SweepReport:
        """One sweep, if no other sweep holds the lock."""
        started = time.perf_counter()
        # A sweep takes milliseconds; a sweeper that dies holding the lock must not hold up
        # recovery for longer than a lease.
        lock_s = self.s.settings.timings.lease_ttl_ms / 1000
        lock = self.s.redis.lock(self.lock_key, timeout=lock_s, blocking=False)
        if not lock.acquire():
            return SweepReport(ran=False)
        try:
            report = self._sweep()
        finally:
            try:
                lock.release()
            except redis.exceptions.LockError:  # outlived its timeout; the claims still guard
                log.warning("sweep.lock_expired")
        report.duration_ms = (time.perf_counter() - started) * 1000
        self._record_duration(report.duration_ms)
        if report.claimed or report.failed or report.republished:
            log.info("sweep.done", **report.to_json())
        return report

    def _record_duration(self, ms: float) -> None:
        """Keep the latest sweep durations for the metrics endpoint (any process scrapes)."""
        ns = self.s.settings.namespace
        pipe = self.s.redis.pipeline(transaction=False)
        pipe.lpush(f"{ns}metrics:sweep_ms", f"{ms:.3f}")
        pipe.ltrim(f"{ns}metrics:sweep_ms", 0, 999)
        # Running totals only go up, as a Prometheus summary's count and sum must.
        pipe.incr(f"{ns}metrics:sweep_count")
        pipe.incrbyfloat(f"{ns}metrics:sweep_ms_total", round(ms, 3))
        pipe.execute()

    def _sweep(self) -> SweepReport:
        report = SweepReport()
        count = int(self.s.redis.incr(self.count_key))
        # A missing epoch marker means Redis lost its data: leases and the index are gone.
        fresh_redis = bool(self.s.redis.set(self.epoch_key, "1", nx=True))
        report.full_scan = fresh_redis or count % self.s.settings.timings.full_scan_every == 1
        candidates = {(t.run_id, t.attempt): t for t in self.s.leases.lapsed()}
        if report.full_scan:
            with self.s.engine.connect() as conn:
                live = select_live(conn)
            alive = self.s.leases.alive([run_id for run_id, _ in live])
            for run_id, attempt in live:
                if run_id not in alive:
                    candidates.setdefault((run_id, attempt), Token(run_id, attempt, "?"))
        self._take(list(candidates.values()), report)
        with self.s.engine.connect() as conn:
            woken = wake_ready(conn)
            stale = touch_stale_queued(conn, self.s.settings.timings.requeue_after_ms)
        again: list[tuple[str, int]] = [*woken, *stale]
        again += self._orphaned({run_id for run_id, _ in stale})
        for run, attempt_no in again:
            self.s.publisher.publish(run, attempt_no)
            report.republished.append(run)
        return report

    def _orphaned(self, stale: set[str]) -> list[tuple[str, int]]:
        """Runs whose message a worker took off the queue more than the death grace ago and
        then died with before reserving it (its main process is killed in that moment): no
        lease, no reservation, still queued at that attempt. Older deliveries are the outbox's
        (`stale`). A live worker reserves a message within milliseconds of taking it, so one
        republished here by mistake is a duplicate, dropped by the lease and the claim (I4)."""
        if self.deliveries is None:
            return []
        t = self.s.settings.timings
        taken = self.deliveries(t.death_grace_ms / 1000, t.requeue_after_ms / 1000)
        if not taken:
            return []
        held = self.s.leases.alive([run_id for run_id, _ in taken])
        reserved = self.s.leases.all_reserved()
        left = [
            (r, a)
            for r, a in dict.fromkeys(taken)
            if r not in held and r not in stale and f"{r}:{a}" not in reserved
        ]
        if not left:
            return []
        with self.s.engine.connect() as conn:
            now = attempt_statuses(conn, [run_id for run_id, _ in left])
        return [(r, a) for r, a in left if now.get(r) == (a, "queued")]

    def _take(self, tokens: list[Token], report: SweepReport) -> None:
        """Claim, in one statement, every candidate whose lease is really gone (I4)."""
        holders = self.s.leases.holders([t.run_id for t in tokens])
        gone = [t for t, holder in zip(tokens, holders, strict=True) if holder is None]
        # Renewed since the index was read (alive), or held by a newer attempt (stale entry).
        newer = [t for t, h in zip(tokens, holders, strict=True) if h not in (None, str(t))]
        limit = self.s.settings.timings.loss_limit
        with self.s.engine.connect() as conn:
            claims = [
                *claim_lost_many(
                    conn, [(t.run_id, t.attempt) for t in gone if t.holder != "?"], limit
                ),
                # Found by the full reconcile: running, with no lease at all (Redis lost it).
                *claim_lost_many(
                    conn,
                    [(t.run_id, t.attempt) for t in gone if t.holder == "?"],
                    limit,
                    seen="lease_missing",
                ),
            ]
            won = {c.run_id for c in claims}
            left = [t for t in gone if t.run_id not in won]
            now = attempt_statuses(conn, [t.run_id for t in left]) if left else {}
        self.s.leases.forget_many(gone + newer)
        for token in left:
            # Died between taking the lease and claiming the queued run: publish it again.
            if now.get(token.run_id) == (token.attempt, "queued"):
                self.s.publisher.publish(token.run_id, token.attempt)
                report.republished.append(token.run_id)
        for claim in claims:
            if claim.status == "failed":
                report.failed.append(claim.run_id)
                log.warning("sweep.run_failed", run_id=claim.run_id, lost_count=claim.lost_count)
                continue
            report.claimed.append(claim.run_id)
            log.debug(  # one line per claim only when asked: `sweep.done` sums them up
                "sweep.claimed",
                run_id=claim.run_id,
                attempt=claim.attempt,
                lost_count=claim.lost_count,
                step=claim.step,
            )
            self.s.publisher.publish(claim.run_id, claim.attempt)
