"""One heartbeat thread per worker process renews all the process's leases in one round trip.

A lease is renewed only while its run's own thread shows progress: a hung run stops being
renewed, its lease lapses and the sweeper hands it to another worker. A run that learns its
lease is lost stops at its next step (I3).

A store blip is not a death. While this process's presence is down, and after it came back
until Redis confirms the lease again, the lease counts for at most the death watch's grace from
the loss (`RunLease.send_time_left_s`); a run that reaches a write or a send in that time waits
for the confirmation (`RunLease.check`) instead of giving its attempt up. The presence wakes the
heartbeat the moment it is back. When Redis lost its data meanwhile (a new store epoch), or the
lease lapsed while this process could not reach it (no master during a failover), the key is
gone: the heartbeat takes it back with SET NX of its own token (`Leases.renew_or_take_back`)
and trusts it only once Postgres says its attempt still owns the run (one read). The sweeper
fences a missing or lapsed key before it claims the run (`lua/fence_missing.lua`), as the death
watch does the keys it takes, so a take-back and a claim exclude each other; and neither claims
anything until `store_grace_ms` after Redis came back (or after it saw Redis away itself),
which exceeds a heartbeat: live holders keep their runs.

A process cut from Postgres alone (Redis reachable) would renew leases whose runs wait on
Postgres for as long as the cut lasts. Its probe (`PostgresReach`) says when it has not reached
Postgres for its bound while another holder has (runtime/fleet/reach.py); the heartbeat then
loses every lease here and gives them up, fenced, for a survivor's sweep to claim as store
faults (`let_go_all`).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

import redis
import structlog

from runtime.fleet.drops import DropWatch
from runtime.fleet.leases import NO_STEP, Leases, Token, monotonic_ms
from runtime.fleet.presence import Presence
from runtime.fleet.reach import PostgresReach
from runtime.sending.in_flight import InFlight
from store.errors import LiyagentError
from store.states import OWNED

log = structlog.get_logger(__name__)


# Bytes never leave, and writes are never made, within this much of the local lease deadline:
# room for the write itself and for the two clocks (ours, Redis's) running a little apart.
SAFETY_MARGIN_MS = 500


# Where each of these runs stands in Postgres now: its attempt and status (store.runs
# `attempt_statuses`); what a lease taken back after Redis lost its data is checked against.
Owners = Callable[[list[str]], dict[str, tuple[int, str]]]
# The statuses in which an attempt owns its run (the fence's, store.runs OWNER_CTE).


class LeaseLost(LiyagentError):
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
    # When the last renewal Redis confirmed, and this process trusted, was sent (monotonic
    # ms), and the store epoch it was confirmed in ("" until known): a presence loss after
    # it, or a new epoch, means Redis must confirm the lease again before it counts in full.
    confirmed_ms: int = 0
    epoch: str = ""
    # How long a run waits, from the presence's loss, for its lease to be confirmed again
    # before it gives its attempt up (the lease TTL plus the sweeper's store grace).
    blip_wait_ms: int = 0
    # The highest step of the run Redis witnessed when this lease was taken, and the step this
    # attempt last wrote (its renewals and release carry it to the witness; lease_life.py).
    witnessed_step: int = NO_STEP
    written_step: int = NO_STEP
    _cond: threading.Condition = field(default_factory=threading.Condition, repr=False)
    # Fenced out by a Stop, an erasure or a loss limit (`Heartbeat.lose_runs`): Postgres has
    # moved on, so its attempt lets its lease go when it stops rather than let it lapse.
    ended_elsewhere: bool = False
    # The sockets this attempt waits on for answers (the send guard's): cut when it is lost.
    in_flight: InFlight = field(default_factory=InFlight, repr=False)

    def wrote(self, step: int) -> None:
        """This attempt's write of `step` committed: the witness moves to it at the next
        renewal, the heartbeat's or a boundary's (no round trip of its own)."""
        self.written_step = max(self.written_step, step)

    def progress(self) -> None:
        """The run's thread is alive and moving: the heartbeat may keep renewing."""
        self.last_progress_ms = monotonic_ms()

    def renewed(self, started_ms: int) -> None:
        if self.presence is not None and not self.presence.trusts(started_ms):
            return  # sent while (or before) this process was absent: proves nothing
        with self._cond:
            self.valid_until_ms = max(self.valid_until_ms, started_ms + self.leases.ttl_ms)
            self.confirmed_ms = max(self.confirmed_ms, started_ms)
            if self.presence is not None and not self.epoch:
                self.epoch = self.presence.store_epoch
            self._cond.notify_all()

    def lose(self, why: str) -> None:
        """The lease is lost for good: this attempt stops at its next write or send, and its
        waits for answers end now (`InFlight.cut`)."""
        with self._cond:
            self.lost_why = self.lost_why or why
            self._cond.notify_all()
        self.in_flight.cut(self.lost_why)

    def blipped(self) -> bool:
        """Whether this process's presence is down, or was lost after Redis last confirmed
        the lease: until a renewal sent after the reconnect is confirmed, the lease counts
        only to the loss plus the grace."""
        p = self.presence
        return p is not None and (
            p.absent_since_ms() is not None or p.up_since_ms > self.confirmed_ms
        )

    def send_time_left_s(self) -> float:
        """Seconds this attempt may still write or send, by the local clock (no network)."""
        if self.lost_why is not None:
            return 0.0
        until = self.valid_until_ms
        if self.presence is not None and self.blipped():
            # Absent now (down, or not refreshed lately), or back but not yet confirmed: a
            # death watch that saw this process absent claims after the grace from then, so
            # sends stop before it (I3).
            until = min(until, self._absent_since_ms(self.presence) + self.presence.grace_ms)
        return (until - SAFETY_MARGIN_MS - monotonic_ms()) / 1000

    def _await_confirmation(self) -> bool:
        """Wait, through a store blip, until the heartbeat confirms the lease again or loses
        it, at most `blip_wait_ms` from the presence's loss (a condition, woken by the
        heartbeat). True when the lease may be used again."""
        p = self.presence
        if p is None or self.blip_wait_ms <= 0:
            return False
        with self._cond:
            while self.lost_why is None and self.blipped():
                left_ms = self._absent_since_ms(p) + self.blip_wait_ms - monotonic_ms()
                if left_ms <= 0:
                    break
                self._cond.wait(min(left_ms, 500) / 1000)
        return self.lost_why is None and self.send_time_left_s() > 0

    @staticmethod
    def _absent_since_ms(p: Presence) -> int:
        """Since when the presence counts as absent, or the last loss once it is back."""
        since = p.absent_since_ms()
        return p.lost_at_ms if since is None else since

    def regained(self) -> bool:
        """After the local deadline passed: whether it passed only because Redis blinked (this
        process's presence lost since the last confirmation) and the heartbeat has confirmed
        or taken back the lease since, waiting for it (at most the blip wait). A lease lost
        for good, or one that lapsed with Redis reachable, is not regained."""
        return self.lost_why is None and self.blipped() and self._await_confirmation()

    def why_not(self) -> str:
        why = self.lost_why or "its lease may have lapsed (no renewal reached Redis in time)"
        return f"run {self.token.run_id}: attempt {self.token.attempt} may not send: {why}"

    def check(self) -> None:
        """Raise `LeaseLost` unless the lease is still ours by the local clock. No network:
        called right before every write and every call that leaves the process (I3)."""
        self.progress()
        if self.send_time_left_s() <= 0:
            if self.regained():
                return  # Redis blinked and confirmed the lease again: the attempt goes on
            self.lose("its local lease deadline passed without a renewal")
            assert self.lost_why is not None
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
        if self.blipped():
            # The heartbeat confirms (or takes back) leases after a store blip, with the
            # Postgres check a take-back needs; this boundary waits for it if it must.
            self.check()
            return
        try:
            ok = self.leases.renew(self.token, self.written_step)
        except redis.RedisError as exc:
            # Unreachable Redis: the lease is ours only until its local deadline, so this
            # attempt stops writing within one lease of losing Redis.
            if self.send_time_left_s() <= 0:
                self.lose(f"Redis unreachable past the lease: {exc}")
                raise LeaseLost(self.token, self.lost_why or "") from exc
            return
        if not ok:
            if self.blipped():  # Redis went away meanwhile: the heartbeat judges it
                self.check()
                return
            self.lose("the lease key is gone or holds another attempt")
            raise LeaseLost(self.token, self.lost_why or "")
        self.renewed(started)


class Heartbeat:
    """Renews every lease this process holds, about every TTL/3, and at once when this
    process's presence comes back after a store blip."""

    def __init__(
        self,
        leases: Leases,
        interval_ms: int,
        stall_ms: int,
        presence: Presence | None = None,
        owners: Owners | None = None,
        blip_wait_ms: int = 0,
        reach: PostgresReach | None = None,
        drops: DropWatch | None = None,
    ) -> None:
        self.leases = leases
        self.interval_ms = interval_ms
        self.stall_ms = stall_ms
        self.presence = presence
        # Postgres's word on who owns a run: a lease taken back after Redis lost its data is
        # trusted only with it (None: such a lease is given up, fail closed).
        self.owners = owners
        self.blip_wait_ms = blip_wait_ms
        self._held: dict[str, RunLease] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        if presence is not None:
            presence.on_up(self._wake.set)
        # This process's Postgres probe (None: no probe, leases are kept through any outage).
        self.reach = reach
        if reach is not None:
            reach.on_cut_off = self.let_go_all
        # Runs ended outside their attempts, heard at once (None: at the next renewal only).
        self.drops = drops
        if drops is not None:
            drops.lose = self.lose_runs

    def hold(self, token: Token, acquired_ms: int, witnessed_step: int = NO_STEP) -> RunLease:
        if self.presence is not None:
            self.presence.start()  # a lease counts only while this process is seen alive
        lease = RunLease(
            token,
            self.leases,
            valid_until_ms=acquired_ms + self.leases.ttl_ms,
            presence=self.presence,
            fresh_ms=self.interval_ms // 2,
            confirmed_ms=acquired_ms,
            epoch="" if self.presence is None else self.presence.store_epoch,
            blip_wait_ms=self.blip_wait_ms,
            witnessed_step=witnessed_step,
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
        if self.reach is not None:
            self.reach.start()
        if self.drops is not None:
            self.drops.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self.drops is not None:
            self.drops.stop()
        if self.reach is not None:
            self.reach.stop()

    def lose_runs(self, runs: dict[str, int | None], why: str) -> list[str]:
        """These runs' attempts were fenced out outside them (a Stop, an erasure, a loss limit;
        runtime/fleet/drops.py): each lease held here of such an attempt (any attempt of a run
        mapped to None, those before the number otherwise) is lost now, its requests cut, and
        let go when its attempt stops (`ended_elsewhere`). Returns the runs whose leases these
        were."""
        with self._lock:
            held = [
                h
                for h in self._held.values()
                if h.token.run_id in runs
                and (runs[h.token.run_id] is None or h.token.attempt < (runs[h.token.run_id] or 0))
            ]
        for h in held:
            h.ended_elsewhere = True
            h.lose(why)
        return [h.token.run_id for h in held]

    def let_go_all(self) -> None:
        """This process cannot reach Postgres while others can (`PostgresReach.cut_off`): every
        lease it holds is lost here first (its runs send and write nothing more, I3), then
        given up in Redis for a survivor's sweep to claim as a store fault, no loss charged
        (`Leases.let_go`). If Redis fails that, the lost leases lapse and are claimed so."""
        with self._lock:
            held = [h for h in self._held.values() if h.lost_why is None]
        if not held:
            return
        for h in held:
            h.lose("this worker cannot reach Postgres while other workers can; they take the run")
        try:
            given = self.leases.let_go([h.token for h in held])
        except redis.RedisError as exc:
            log.warning("lease.let_go_failed", error=str(exc), leases=len(held))
            return
        log.warning(
            "lease.let_go",
            reason="postgres unreachable from this worker only",
            leases=len(given),
            run_ids=[t.run_id for t in given],
        )

    def beat(self) -> None:
        """Renew, in one pipeline, every lease whose run made progress within the stall bound;
        leases confirmed before Redis lost its data are taken back (`_take_back`)."""
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
        p = self.presence
        if p is not None and not p.up:
            # Absent: no renewal sent now would be trusted, and one that reaches a Redis this
            # process has not yet seen come back must not be read as a lost lease. The runs
            # wait (`RunLease.check`); the presence wakes this beat when it is back.
            return
        epoch = "" if p is None else p.store_epoch
        # Confirmed before Redis lost its data (a new epoch), or before this process lost
        # Redis (no master during a failover, a restart, a cut): the key may have lapsed or
        # be gone meanwhile, which says nothing about this process. Taken back, not lost.
        back = [h for h in due if (h.epoch and epoch and h.epoch != epoch) or h.blipped()]
        due = [h for h in due if h not in back]
        if back:
            self._take_back(back, now, epoch)
        if not due:
            return
        try:
            results = self.leases.renew_many([(h.token, h.written_step) for h in due])
        except redis.RedisError as exc:
            for h in due:
                if now >= h.valid_until_ms - SAFETY_MARGIN_MS and not h.blipped():
                    h.lose(f"Redis unreachable past the lease: {exc}")
            log.warning("lease.renew_failed", error=str(exc), leases=len(due))
            return
        for h, ok in zip(due, results, strict=True):
            if ok:
                h.renewed(now)
            elif p is not None and (not p.up or p.up_since_ms > now or p.store_epoch != epoch):
                continue  # Redis went away during this beat: judged at the next one
            else:
                h.lose("the lease key is gone or holds another attempt")
                log.warning("lease.lost", run_id=h.token.run_id, attempt=h.token.attempt)

    def _take_back(self, back: list[RunLease], now: int, epoch: str) -> None:
        """Redis lost its data, or this process lost Redis, since these leases were confirmed:
        renew them, or take back with SET NX of their own token the keys that lapsed or were
        forgotten meanwhile, then trust each only once Postgres says its attempt still owns the
        run (I3); one claimed meanwhile (a claimer fences the key first) is lost and let go."""
        try:
            results = self.leases.renew_or_take_back([h.token for h in back])
        except redis.RedisError as exc:
            log.warning("lease.take_back_failed", error=str(exc), leases=len(back))
            return
        got = [h for h, r in zip(back, results, strict=True) if r]
        for h, r in zip(back, results, strict=True):
            if not r:  # a fence or a newer attempt holds it: the run was claimed
                h.lose("its run was claimed while Redis was away")
        if not got:
            return
        try:
            owners = None if self.owners is None else self.owners([h.token.run_id for h in got])
        except Exception as exc:  # Postgres away too: keep them untrusted, ask at the next beat
            log.warning("lease.take_back_unchecked", error=str(exc), leases=len(got))
            return
        for h in got:
            now_at = None if owners is None else owners.get(h.token.run_id)
            if now_at is not None and now_at[0] == h.token.attempt and now_at[1] in OWNED:
                h.epoch = epoch
                h.renewed(now)
                log.info("lease.taken_back", run_id=h.token.run_id, attempt=h.token.attempt)
                continue
            h.lose("its run was claimed while Redis was away")
            # Let it go so the run's next attempt takes its lease at once (else it lapses).
            with contextlib.suppress(redis.RedisError):
                self.leases.release(h.token)

    def _loop(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(self.interval_ms / 1000)
            self._wake.clear()
            if self._stop.is_set():
                return
            try:
                self.beat()
            except Exception:  # the heartbeat must outlive any one bad renewal
                log.exception("lease.heartbeat_error")
