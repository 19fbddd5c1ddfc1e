"""The sweeper: claims each run whose lease lapsed, once per loss, and republishes stale work.

It runs in every worker's main process, on a thread of its own (`SweepThread`), so it runs on
time whatever the run slots are doing; a pace key in Redis keeps the fleet to about one sweep
per `sweep_interval_ms`, and a Redis lock to one at a time. The claim in Postgres is the real
guard: one conditional update per lapsed run, of two sweeps one wins (I4).
Lapsed leases are found through the deadline index; a periodic full reconcile (and one after
Redis loses its data) also finds running runs that hold no lease at all.

A store blip is not a death. After Redis comes back without its data (a new store epoch),
no run is claimed for having no lease for `store_grace_ms`: live holders re-establish presence
and take their leases back meanwhile (runtime/fleet/heartbeat.py). A run then found running with no
lease has its key fenced first (`Leases.fence_missing`: a take-back and the claim exclude each
other), and is claimed as a store fault, with no loss charged, while its holder's process is
connected to Redis, or as a loss when that process is gone. Queued runs whose messages Redis
lost are published again as soon as the new epoch is seen (`requeue_lost_messages`), not after
the outbox's `requeue_after_ms`.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta

import redis
import structlog

from runtime.base.logs import SaidOnce
from runtime.fleet import usage_notes
from runtime.fleet.leases import StoreEpoch, Token, monotonic_ms
from runtime.fleet.reach import PostgresReach
from runtime.flow import tenants
from runtime.recovery.deps import RecoveryDeps
from runtime.recovery.untraced import TRACE_LIMIT, Traced, unheld
from store.losses import claim_lost_many, claim_store_faulted_many
from store.rows import QueuedAttempt
from store.runs import (
    db_now,
    select_live,
    still_queued,
    touch_queued_before,
    touch_stale_queued,
)
from store.states import RunStatus, Seen
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
    # Claimed as a store fault (Redis lost the lease; the holder lives): no loss charged.
    store_faulted: list[str] = field(default_factory=list)
    # Within the grace after Redis came back without its data: no run was claimed for having
    # no lease.
    settling: bool = False
    duration_ms: float = 0.0

    def to_json(self) -> dict[str, object]:
        return {
            "ran": self.ran,
            "full_scan": self.full_scan,
            "settling": self.settling,
            "claimed": self.claimed,
            "store_faulted": self.store_faulted,
            "failed": self.failed,
            "republished": self.republished,
            "duration_ms": round(self.duration_ms, 2),
        }


class Sweeper:
    def __init__(
        self, deps: RecoveryDeps, deliveries: Deliveries | None = None, traced: Traced | None = None
    ) -> None:
        self.s = deps
        self.deliveries = deliveries
        # What the broker holds (None: the outbox publishes every run queued past its bound).
        self.traced = traced
        ns = deps.namespace
        self.lock_key = deps.leases.sweep_lock_key
        self.pace_key = deps.leases.sweep_pace_key
        self.count_key = f"{ns}sweeper:count"
        self._sent: set[tuple[str, int]] = set()
        # After this sweeper itself could not reach Redis (no master, say), nothing is claimed
        # for the store grace from when it answers again (monotonic ms; see `_sweep`).
        self._unreachable = False
        self._settle_until_ms = 0

    def sweep(self) -> SweepReport:
        """One sweep, if no other sweep holds the lock."""
        started = time.perf_counter()
        # A sweep takes milliseconds; a sweeper that dies holding the lock must not hold up
        # recovery for longer than a lease.
        lock_s = self.s.timings.lease_ttl_ms / 1000
        lock = self.s.redis.lock(self.lock_key, timeout=lock_s, blocking=False)
        if not self._reached(lock.acquire):
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
        if report.claimed or report.failed or report.republished or report.store_faulted:
            log.info("sweep.done", **report.to_json())
        return report

    def takes_turn(self, hold_ms: int) -> bool:
        """Whether this process sweeps now: not when another process of the fleet swept less
        than `hold_ms` ago; the first caller after the pace key lapsed takes it (SET NX PX)."""
        return self._reached(
            lambda: self.s.redis.set(self.pace_key, self.s.holder, nx=True, px=hold_ms)
        )

    def _reached(self, first: Callable[[], object]) -> bool:
        """Make a sweep's first Redis call; after a failed one, the first that answers starts
        the store grace (this sweeper saw Redis away: so did every holder)."""
        try:
            answer = bool(first())
        except redis.RedisError:
            self._unreachable = True
            raise
        if self._unreachable:
            self._unreachable = False
            self._settle_until_ms = monotonic_ms() + self.s.timings.store_grace_ms
        return answer

    def _record_duration(self, ms: float) -> None:
        """Keep the latest sweep durations for the metrics endpoint (any process scrapes)."""
        ns = self.s.namespace
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
        epoch = self.s.leases.store_epoch()
        requeued = requeue_lost_messages(self.s, epoch)
        report.republished += [run_id for run_id, _ in requeued]
        self._sent = set(requeued)  # one message per run and attempt from one sweep
        # Right after Redis came back without its data, live holders are still taking their
        # leases back: no run is claimed for having none until the grace has passed. (Lapsed
        # leases are this epoch's own, and no holder can take one back: they are claimed.)
        # Right after Redis restarted or failed over with its data, or after this sweeper
        # itself could not reach it, leases may have lapsed while Redis was away, which says
        # nothing about their holders: those are not claimed either until the grace has
        # passed, while live holders take them back (a store fault is not a death).
        grace_ms = self.s.timings.store_grace_ms
        away = epoch.restart_settling(grace_ms) or monotonic_ms() < self._settle_until_ms
        report.settling = away or epoch.data_settling(grace_ms)
        # Until a full reconcile ran in this epoch (Redis lost its data: leases and the index
        # are gone), every sweep after the grace reconciles running runs against Redis.
        report.full_scan = not report.settling and (
            not epoch.reconciled or count % self.s.timings.full_scan_every == 1
        )
        candidates = {} if away else {(t.run_id, t.attempt): t for t in self.s.leases.lapsed()}
        if report.full_scan:
            with self.s.engine.connect() as conn:
                live = select_live(conn)
            alive = self.s.leases.alive([run_id for run_id, _, _ in live])
            unheld = [Token(r, a, h or "?") for r, a, h in live if r not in alive]
            # A lease whose deadline is still indexed ran out its TTL (its holder stopped
            # renewing it) after `lapsed()` was read: a loss, claimed with its holder. Redis
            # losing a lease loses its index entry with it (one script writes both), and only
            # those are missing ("?"), claimed as store faults while their holder is connected:
            # a stopped process's connections stay open, so a lapse is never judged by them.
            indexed = self.s.leases.indexed(unheld)
            for token in unheld:
                found = token if token in indexed else Token(token.run_id, token.attempt, "?")
                candidates.setdefault((token.run_id, token.attempt), found)
        self._take(list(candidates.values()), report)
        self._claim_given_up(report)
        if report.full_scan and not epoch.reconciled:
            self.s.leases.mark_epoch(epoch, "reconciled")
        with self.s.engine.connect() as conn:
            woken = wake_ready(conn)
            stale = touch_stale_queued(conn, self.s.timings.requeue_after_ms)
        again = [*(QueuedAttempt(r, a) for r, a in woken), *self._not_waiting(stale)]
        again += self._orphaned({q.run_id for q in stale})
        for woke, _ in woken:
            self.s.changes.announce(woke)
        self._publish_again(again, report)
        for held in tenants.admit_every(self.s.engine, self.s.tenants):
            self.s.changes.announce(held.run_id)
            self._sent.add((held.run_id, held.attempt))
            try:
                self.s.publisher.publish(held.run_id, held.attempt, held.priority)
            except Exception as exc:  # Postgres has it queued: the outbox publishes it later
                log.warning("tenant.publish_failed", run_id=held.run_id, error=type(exc).__name__)
                continue
            report.republished.append(held.run_id)
        return report

    def _publish_again(self, again: list[QueuedAttempt], report: SweepReport) -> None:
        """Publish queued runs' messages again in one round trip (each at its run's priority,
        a redelivered one first), but not those this sweep did already."""
        fresh = {(q.run_id, q.attempt): q for q in again if (q.run_id, q.attempt) not in self._sent}
        self._sent.update(fresh)
        self.s.publisher.publish_many(list(fresh.values()))
        report.republished += [q.run_id for q in fresh.values()]

    def _not_waiting(self, stale: list[QueuedAttempt]) -> list[QueuedAttempt]:
        """Of the runs queued past `requeue_after_ms` (the outbox), those whose message waits in
        no queue: in a backlog every run waits that long, and publishing each again would add
        a message per waiting run every `requeue_after_ms`. Above `TRACE_LIMIT` messages none
        is (the broker is not read; each run, stamped, is looked at again after
        `requeue_after_ms`, until fewer wait)."""
        if not stale or self.traced is None:
            return stale
        held = self.traced(TRACE_LIMIT)
        if held is None:
            log.info("sweep.outbox_not_read", why=f"more than {TRACE_LIMIT} messages queued")
            return []
        return [q for q in stale if (q.run_id, q.attempt) not in held.waiting]

    def _orphaned(self, stale: set[str]) -> list[QueuedAttempt]:
        """Runs whose message a worker took off the queue more than the death grace ago and
        then died with before reserving it (its main process is killed in that moment): no
        lease, no reservation, still queued at that attempt. Older deliveries are the outbox's
        (`stale`). A live worker reserves a message within milliseconds of taking it, so one
        republished here by mistake is a duplicate, dropped by the lease and the claim (I4)."""
        if self.deliveries is None:
            return []
        t = self.s.timings
        taken = self.deliveries(t.death_grace_ms / 1000, t.requeue_after_ms / 1000)
        if not taken:
            return []
        return unheld(self.s, [(r, a) for r, a in taken if r not in stale])

    def _claim_given_up(self, report: SweepReport) -> None:
        """Claim the runs whose holders gave their leases up because they could not reach
        Postgres while others could (`Heartbeat.let_go_all`; the keys are fenced already): as
        store faults while the holder's process is connected, no loss charged; as a loss if
        it is gone meanwhile. Each exactly once (I4); the fences go once the claims commit."""
        tokens = self.s.leases.given_up()
        if not tokens:
            return
        present = sorted(self.s.leases.connected_holders())
        pairs = [(t.run_id, t.attempt) for t in tokens]
        limit = self.s.timings.loss_limit
        # What the lost attempts reserved for steps they may not have written (one MGET).
        notes = usage_notes.read(self.s.redis, self.s.namespace, pairs)
        with self.s.engine.connect() as conn:
            faulted = claim_store_faulted_many(conn, pairs, present, notes)
            won = {c.run_id for c in faulted}
            lost = claim_lost_many(
                conn,
                [p for p in pairs if p[0] not in won],
                limit,
                seen=Seen.LEASE_GIVEN_UP,
                ask_yields=self.s.resumed_first,
                notes=notes,
            )
        self.s.leases.unfence(tokens)
        self.s.leases.claimed_given_up(tokens)  # claimed now, or moved on before
        for claim in [*faulted, *lost]:
            self.s.changes.announce(claim.run_id)
        self.s.leases.forget_steps([c.run_id for c in [*faulted, *lost] if c.status == "failed"])
        resumed: list[QueuedAttempt] = []
        for claim in [*faulted, *lost]:
            if claim.status == "failed":
                report.failed.append(claim.run_id)
                log.warning("sweep.run_failed", run_id=claim.run_id, reason="given_up")
                continue
            (report.store_faulted if claim.run_id in won else report.claimed).append(claim.run_id)
            log.info("sweep.given_up_claimed", run_id=claim.run_id, attempt=claim.attempt)
            resumed.append(QueuedAttempt(claim.run_id, claim.attempt))
        self.s.publisher.publish_many(resumed)

    def _take(self, tokens: list[Token], report: SweepReport) -> None:
        """Claim, in one statement each, every candidate whose lease is really gone (I4): a
        lapsed lease as a loss; a missing one (found by the full reconcile) once its key is
        fenced, as a store fault while its holder's process is connected, else as a loss."""
        known = [t for t in tokens if t.holder != "?"]
        holders = self.s.leases.holders([t.run_id for t in known])
        # Lapsed: fenced like a missing one, so that its holder taking it back after a store
        # blip (SET NX, heartbeat.py) and this claim exclude each other; one taken back between
        # the read and the fence is left alone (its index entry is the renewed lease's).
        gone = self.s.leases.fence_missing(
            [t for t, holder in zip(known, holders, strict=True) if holder is None]
        )
        # Renewed since the index was read (alive), or held by a newer attempt (stale entry).
        newer = [t for t, h in zip(known, holders, strict=True) if h not in (None, str(t))]
        # Running with no lease at all (Redis lost it): held by the sweeper while it claims,
        # so a holder taking its lease back meanwhile and this claim exclude each other.
        fenced = self.s.leases.fence_missing([t for t in tokens if t.holder == "?"])
        present = sorted(self.s.leases.connected_holders()) if fenced else []
        limit = self.s.timings.loss_limit
        missing = [(t.run_id, t.attempt) for t in fenced]
        lapsed = [(t.run_id, t.attempt) for t in gone]
        # What the lost attempts reserved for steps they may not have written (one MGET).
        notes = usage_notes.read(self.s.redis, self.s.namespace, [*lapsed, *missing])
        try:
            with self.s.engine.connect() as conn:
                faulted = claim_store_faulted_many(conn, missing, present, notes)
                won = {c.run_id for c in faulted}
                asks = self.s.resumed_first
                claims = [
                    *claim_lost_many(conn, lapsed, limit, ask_yields=asks, notes=notes),
                    *claim_lost_many(
                        conn,
                        [p for p in missing if p[0] not in won],
                        limit,
                        seen=Seen.LEASE_MISSING,
                        ask_yields=asks,
                        notes=notes,
                    ),
                ]
                won |= {c.run_id for c in claims}
                left = [t for t in [*gone, *fenced] if t.run_id not in won]
                again = still_queued(conn, [(t.run_id, t.attempt) for t in left])
        finally:
            self.s.leases.unfence(gone + fenced)  # the claims are committed: next attempts lease
        self.s.leases.forget_many(gone + newer)
        for claim in [*faulted, *claims]:
            self.s.changes.announce(claim.run_id)
        self.s.leases.forget_steps(
            [c.run_id for c in [*faulted, *claims] if c.status == RunStatus.FAILED]
        )
        # Died between taking the lease and claiming the queued run: publish it again, at the
        # head of the queue it had reached.
        self._publish_again([q._replace(redelivered=True) for q in again], report)
        resumed: list[QueuedAttempt] = []  # published together, in one round trip
        for claim in faulted:
            if claim.status == RunStatus.FAILED:
                report.failed.append(claim.run_id)
                log.warning("sweep.run_failed", run_id=claim.run_id, reason="store_fault")
                continue
            report.store_faulted.append(claim.run_id)
            log.info("sweep.store_faulted", run_id=claim.run_id, attempt=claim.attempt)
            resumed.append(QueuedAttempt(claim.run_id, claim.attempt))
        for claim in claims:
            if claim.status == RunStatus.FAILED:
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
            resumed.append(QueuedAttempt(claim.run_id, claim.attempt))
        self.s.publisher.publish_many(resumed)


class SweepThread:
    """Sweeps from a worker's main process, on its own thread: never queued behind runs, never
    expired in a broker while every slot is busy (a beat-fired task was). Every worker runs one;
    each looks every third of `sweep_interval_ms` and sweeps when the fleet's pace key is free,
    so the fleet sweeps about once per interval and never goes longer than one without a sweep
    while any worker reaches Redis. `guard` runs each look (a database outage is said once)."""

    def __init__(
        self,
        sweeper: Sweeper,
        reach: PostgresReach | None = None,
        guard: Callable[[Callable[[], SweepReport]], SweepReport | None] | None = None,
    ) -> None:
        self.sweeper = sweeper
        # This process's own word on Postgres (`Heartbeat.reach`; see `look`).
        self.reach = reach
        interval_ms = sweeper.s.timings.sweep_interval_ms
        self.look_ms = max(interval_ms // 3, 1)
        self.hold_ms = max(interval_ms - self.look_ms, 1)
        self.guard = guard or (lambda work: work())
        self._stop = threading.Event()
        self._outage = SaidOnce(log, "sweep.failed", "sweep.resumed")
        self._thread = threading.Thread(target=self._loop, name="liyagent-sweeps", daemon=True)

    def start(self) -> None:
        if self.reach is not None:
            self.reach.start()  # this process's own word on Postgres (see `look`)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def look(self) -> SweepReport | None:
        """One sweep when it is this process's turn. A look that is not its turn touches no
        Postgres, so it is kept out of `guard`: it must not end a database outage it reports.
        A process whose probe has not reached Postgres lately does not take the turn: cut
        from Postgres alone, its sweep would hang holding the fleet's lock, and sweepers that
        reach it sweep instead."""
        if self.reach is not None and not self.reach.reached_lately():
            return SweepReport(ran=False)
        if not self.sweeper.takes_turn(self.hold_ms):
            return SweepReport(ran=False)
        return self.guard(self.sweeper.sweep)

    def _loop(self) -> None:
        # The first look at once: a worker that starts after another died claims the leases
        # that lapsed meanwhile now, not a look later (the pace key still keeps the fleet's).
        while True:
            self._look_once()
            if self._stop.wait(self.look_ms / 1000):
                return

    def _look_once(self) -> None:
        try:
            self.look()
        except (redis.RedisError, OSError) as exc:
            self._outage.lost(error=str(exc))  # the next look tries again
            return
        except Exception:  # the sweeps must outlive any one bad sweep
            log.exception("sweep.error")
        self._outage.reached()


def requeue_lost_messages(s: RecoveryDeps, epoch: StoreEpoch) -> list[tuple[str, int]]:
    """Once per store epoch, as soon as it is seen (by a sweep or the death watch): publish
    again every run queued since before this Redis's data was born, whose message went to the
    Redis that is gone (or to none, while Redis was away). The cut-off is Postgres's clock read
    first, less the epoch's age by Redis's clock read after it: it errs towards leaving a run
    queued at the very moment Redis came back to the outbox, never towards publishing one
    queued (or claimed) after. Each run is stamped by one statement so that only one caller
    publishes it (a message that arrives anyway is dropped by the lease and the claim, I4)."""
    if epoch.requeued:
        return []
    again: list[QueuedAttempt] = []
    with s.engine.connect() as conn:
        now = db_now(conn)
        epoch = s.leases.store_epoch()  # after Postgres's clock: the age is no shorter
        if epoch.requeued:
            return []
        # Never later than now: a run stamped by this loop (queued_at = now()) is not matched
        # again.
        cutoff = min(now, now - timedelta(milliseconds=epoch.now_ms - epoch.born_ms))
        while batch := touch_queued_before(conn, cutoff):
            again += batch
    s.publisher.publish_many(again)
    # Marked after publishing: a caller that fails first leaves the runs it did not stamp to
    # the next one (those it stamped are the outbox's).
    s.leases.mark_epoch(epoch, "requeued")
    if again:
        log.info("sweep.requeued_lost_messages", runs=len(again), store_epoch=epoch.id)
    return [(q.run_id, q.attempt) for q in again]
