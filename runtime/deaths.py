"""The death watch: a process that dies is seen at once, not when its lease lapses.

Every engine process names its Redis connections after its holder (`presence.py`). Redis drops
the connections of a process that dies, so a holder with leases or reserved messages and no
connection left is dead. After a short grace (a blip reconnects well within it) its leases are
taken back in Redis, atomically and only if it has not come back meanwhile (its presence epoch
is unchanged), and its runs are claimed the usual way, database first, exactly once (I4). Its
reserved messages whose runs are still queued are published again at once, as are the
messages of runs it had leased but not yet claimed.

One watch runs at a time (a leader key in Redis); every worker's main process offers to run it.
A pool child that dies while its main process lives is seen sooner still, by that parent
(`claim_dead_child`). The lease remains the only judge of a process that is alive but stalled:
its connections stay open, so the watch leaves it alone.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

import redis
import structlog

from runtime.leases import Token
from runtime.services import Services
from store.runs import attempt_statuses, claim_lost_many

log = structlog.get_logger(__name__)

LEADER_TTL_MS = 2000

# KEYS[1] = leader key; ARGV[1] = this watcher, ARGV[2] = ttl ms.
# Take the lead if free, or keep it if ours; returns 1 while this watcher leads.
_LEAD = """
local cur = redis.call('GET', KEYS[1])
if cur == false then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  return 1
end
if cur == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
return 0
"""


@dataclass
class DeathReport:
    ran: bool = True
    dead: list[str] = field(default_factory=list)
    claimed: list[str] = field(default_factory=list)
    republished: list[str] = field(default_factory=list)
    duration_ms: float = 0.0


@dataclass
class _Absent:
    since_ms: int
    epoch: str


def _ms() -> int:
    return int(time.monotonic() * 1000)


class DeathWatch:
    """Finds holders with no connection left and takes their work back, once."""

    def __init__(self, services: Services) -> None:
        self.s = services
        self.grace_ms = services.settings.timings.death_grace_ms
        ns = services.settings.namespace
        self.leader_key = f"{ns}deaths:leader"
        self._lead = services.redis.register_script(_LEAD)
        self._absent: dict[str, _Absent] = {}

    def poll(self) -> DeathReport:
        """One look; claims the runs of every holder absent past the grace."""
        started = time.perf_counter()
        if not self._lead(keys=[self.leader_key], args=[self.s.holder, LEADER_TTL_MS]):
            self._absent.clear()  # another watcher leads; its view is the one that counts
            return DeathReport(ran=False)
        report = DeathReport()
        connected = self.s.leases.connected_holders()
        holders = self.s.leases.holders_with_work()
        now = _ms()
        for gone in set(self._absent) - holders:
            del self._absent[gone]
        for holder in holders - connected:
            if self._due(holder, now):
                self._take(holder, report)
        for holder in holders & connected:
            self._absent.pop(holder, None)
        report.duration_ms = (time.perf_counter() - started) * 1000
        if report.dead:
            log.info("deaths.taken", **report.__dict__)
        return report

    def _due(self, holder: str, now: int) -> bool:
        """Absent since at least the grace, with no reconnect in between (epoch unchanged)."""
        epoch = self.s.leases.presence_epoch(holder)
        seen = self._absent.get(holder)
        if seen is None or seen.epoch != epoch:
            self._absent[holder] = _Absent(now, epoch)
            return False
        return now - seen.since_ms >= self.grace_ms

    def _take(self, holder: str, report: DeathReport) -> None:
        epoch = self._absent.pop(holder).epoch
        taken = self.s.leases.take_dead(holder, epoch)
        if taken is None:
            return  # it came back between the look and the take: alive after all
        tokens, reserved = taken
        report.dead.append(holder)
        report.claimed += claim_and_publish(self.s, tokens, "connection_closed")
        # A lease taken between its acquire and its claim leaves the run queued at that
        # attempt, and the acquire let the message's reservation go: it is published again
        # like a reserved one (claimed runs moved to the next attempt and are left alone).
        leased = [(t.run_id, t.attempt) for t in tokens]
        report.republished += republish_reserved(self.s, list(dict.fromkeys(reserved + leased)))


def claim_and_publish(s: Services, tokens: list[Token], seen: str) -> list[str]:
    """Claim each lost attempt in Postgres (one statement; of two claims one wins, I4) and
    publish the new attempts. Audited as lost, with how the death was seen."""
    if not tokens:
        return []
    with s.engine.connect() as conn:
        claims = claim_lost_many(
            conn, [(t.run_id, t.attempt) for t in tokens], s.settings.timings.loss_limit, seen=seen
        )
    for claim in claims:
        if claim.status != "failed":
            s.publisher.publish(claim.run_id, claim.attempt)
        log.debug(  # `deaths.taken` and `deaths.pool_child` sum the claims up
            "deaths.claimed",
            run_id=claim.run_id,
            attempt=claim.attempt,
            status=claim.status,
            lost_count=claim.lost_count,
            seen=seen,
        )
    return [c.run_id for c in claims]


def republish_reserved(s: Services, reserved: list[tuple[str, int]]) -> list[str]:
    """Messages a dead process had reserved (or leased without claiming their runs): publish
    again those whose runs are still queued at that attempt (a duplicate of a message that does
    arrive is dropped by the lease and the claim, I4)."""
    if not reserved:
        return []
    with s.engine.connect() as conn:
        now = attempt_statuses(conn, [run_id for run_id, _ in reserved])
    again = [(r, a) for r, a in reserved if now.get(r) == (a, "queued")]
    for run_id, attempt in again:
        s.publisher.publish(run_id, attempt)
    return [r for r, _ in again]


def claim_dead_child(s: Services, token: Token) -> list[str]:
    """A worker's main process saw the pool child holding `token` die: take its lease back
    (only if it still holds this token) and claim the run at once, without a sweep."""
    if not s.leases.take_token(token):
        return []
    return claim_and_publish(s, [token], "pool_child_died")


class DeathWatchThread:
    """Runs the watch every `death_poll_ms` in a worker's main process (the leader key keeps
    it to one at a time across the deployment)."""

    def __init__(self, services: Services) -> None:
        self.watch = DeathWatch(services)
        self.poll_ms = services.settings.timings.death_poll_ms
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="liyagent-deaths", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def _loop(self) -> None:
        while not self._stop.wait(self.poll_ms / 1000):
            try:
                self.watch.poll()
            except (redis.RedisError, OSError) as exc:
                log.warning("deaths.poll_failed", error=str(exc))
            except Exception:  # the watch must outlive any one bad poll
                log.exception("deaths.poll_error")


__all__ = [
    "DeathReport",
    "DeathWatch",
    "DeathWatchThread",
    "claim_and_publish",
    "claim_dead_child",
    "republish_reserved",
]
