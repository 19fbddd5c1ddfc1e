"""The death watch: a process that dies is seen at once, not when its lease lapses.

Every engine process names its Redis connections after its holder (`presence.py`). Redis drops
the connections of a process that dies, so a holder with leases or reserved messages and no
connection left is dead. After a short grace (a blip reconnects well within it) its leases are
taken back in Redis, atomically and only if it has not come back meanwhile (its presence epoch
is unchanged), and its runs are claimed the usual way, database first, exactly once (I4). Its
reserved messages whose runs are still queued are published again at once, as are the
messages of runs it had leased but not yet claimed, and (as soon as a worker's main process is
seen gone, and again when its work is taken) every queued run whose message the broker holds
nowhere: one the dead worker took off the queue in the instant before kombu recorded it
(`untraced.py`).

One watch runs at a time (a leader key in Redis); every worker's main process offers to run it.
The leader key names the leader's presence connection, and each follower asks Redis about that
one connection on every look (`CLIENT LIST ID`, constant cost): a leader that dies is replaced
within a look, not when its key's TTL runs out, so a death is claimed as fast whichever worker
died. The key's TTL stays as the backstop for a leader that lives but stops looking.

Why one leader rather than every worker watching and claiming (fenced in Postgres, so only one
claim would win, I4): the full look is a CLIENT LIST, whose cost grows with the deployment's
connections, and every death would be claimed and republished by every watcher. N watchers
all looking would cost Redis N times that per look (N squared as a fleet grows) and Postgres N
claim statements per lost run; a follower costs two constant round trips per look, and Postgres
nothing.
A holder is not watched for the whole grace by a watcher that did not see it go: one that
starts after the only other worker died, or takes the lead from a leader that died with it,
counts each absence from when Redis last saw the holder present (its presence epoch's age, by
the refresh bound the epoch names: `presence.absent_for_ms`), so it takes at its first look
(made at once when the worker is ready) the work of holders gone longer than the grace.

A pool child that dies while its main process lives is seen sooner still, by that parent
(`claim_dead_child`). The lease remains the only judge of a process that is alive but stalled:
its connections stay open, so the watch leaves it alone.

A store blip is not a death: when Redis itself restarts or fails over, every holder vanishes at
once. After Redis comes back with its data (a new server run id, `leases._EPOCH`) the watch
claims nothing for `store_grace_ms`, and forgets whom it saw absent before, so only holders
that never come back are claimed (after a data loss no holder of before is left in Redis to
judge: the sweeper's reconcile takes those). So does a watcher that itself could not reach
Redis (no master, say, during a Sentinel failover), from when it reaches it again. It also
publishes again, at once, the queued runs whose messages an empty Redis lost
(`sweeper.requeue_lost_messages`).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

import redis
import sqlalchemy as sa
import structlog

from runtime.fleet import usage_notes
from runtime.fleet.leases import Token
from runtime.fleet.presence import Presence, absent_for_ms, connection_name
from runtime.recovery.deps import RecoveryDeps
from runtime.recovery.sweeper import requeue_lost_messages
from runtime.recovery.untraced import Traced, republish_untraced, untraced
from store.losses import claim_lost_many
from store.rows import QueuedAttempt
from store.runs import still_queued
from store.states import RunStatus, Seen

log = structlog.get_logger(__name__)

LEADER_TTL_MS = 2000
# Lost runs claimed per statement (and published per round trip) when a process dies holding
# many: small enough that the first are on their way within milliseconds and one statement
# never locks a whole process's runs, large enough that 1,000 runs take a handful.
CLAIM_BATCH = 100

# KEYS[1] = leader key; ARGV[1] = this watcher's holder, ARGV[2] = the id of its presence
# connection, ARGV[3] = ttl ms, ARGV[4] = a leader value this watcher saw dead ("" if none).
# The value is "<holder> <connection id>". Take the lead if it is free, or still held by the
# leader seen dead (compare-and-set: one follower wins, and a leader that came back with a new
# connection keeps it), or keep it if ours (the id follows our reconnects). Returns the
# value now: ours while this watcher leads, the leader's otherwise.
_LEAD = """
local cur = redis.call('GET', KEYS[1])
local mine = ARGV[1] .. ' ' .. ARGV[2]
if cur == false or cur == ARGV[4] or string.sub(cur, 1, #ARGV[1] + 1) == ARGV[1] .. ' ' then
  redis.call('SET', KEYS[1], mine, 'PX', ARGV[3])
  return mine
end
return cur
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

    def __init__(
        self, deps: RecoveryDeps, presence: Presence, traced: Traced | None = None
    ) -> None:
        self.s = deps
        self.presence = presence
        # Every run message the broker holds (None: messages lost in a dying worker's
        # BRPOP are left to the outbox, `untraced.py`).
        self.traced = traced
        # Worker main processes consuming the queue whose connections were open at the last
        # look: one gone since, a dead one taken, or a lead taken from a dead leader is a death
        # to look for untraced messages at (`_untraced_due`), at most once a grace.
        self._consuming: set[str] = set()
        self._untraced_due = False
        self._untraced_ms = 0
        # The runs a death's first look found held nowhere, confirmed at the next look.
        self._suspects: set[tuple[str, int]] | None = None
        self.grace_ms = deps.timings.death_grace_ms
        self.store_grace_ms = deps.timings.store_grace_ms
        self.leader_key = leader_key(deps.namespace)
        self._lead = deps.redis.register_script(_LEAD)
        self._absent: dict[str, _Absent] = {}
        # Until when (monotonic ms) nothing is claimed after this watcher itself could not
        # reach Redis: every holder lost Redis with it, and reconnects meanwhile.
        self._settle_until_ms = 0
        self._failed = False
        # A watcher leads only while present: its followers judge it by that connection.
        presence.start()

    def poll(self) -> DeathReport:
        """One look; claims the runs of every holder absent past the grace."""
        started = time.perf_counter()
        if not self._leads():
            self._absent.clear()  # another watcher leads; its view is the one that counts
            self._consuming.clear()
            self._suspects = None
            return DeathReport(ran=False)
        report = DeathReport()
        epoch = self.s.leases.store_epoch()
        report.republished += [run_id for run_id, _ in requeue_lost_messages(self.s, epoch)]
        if self._failed:
            self._failed = False
            self._settle_until_ms = _ms() + self.store_grace_ms
        if epoch.restart_settling(self.store_grace_ms) or _ms() < self._settle_until_ms:
            # Redis just restarted or failed over, or this watcher could not reach it: every
            # holder is reconnecting; absences seen so far (or now) say nothing about any
            # process, none counts until the grace.
            self._absent.clear()
            report.duration_ms = (time.perf_counter() - started) * 1000
            return report
        connected = self.s.leases.connected_holders()
        holders = self.s.leases.holders_with_work()
        consumers = self.s.leases.consumers() if self.traced is not None else set()
        now = _ms()
        for gone in set(self._absent) - holders:
            del self._absent[gone]
        for holder in holders - connected:
            if self._due(holder, now):
                self._take(holder, epoch.id, report)
        for holder in holders & connected:
            self._absent.pop(holder, None)
        # A consumer that ended cleanly left the set first: only one that died counts.
        if (self._consuming - connected) & consumers or consumers.intersection(report.dead):
            self._untraced_due = True
        self._consuming = consumers & connected
        self._look_for_untraced(report, now)
        report.duration_ms = (time.perf_counter() - started) * 1000
        if report.dead:
            log.info("deaths.taken", **report.__dict__)
        return report

    def forget(self) -> None:
        """A look failed (Redis unreachable): absences seen before say nothing any more, and
        none seen within the store grace after Redis answers again counts either."""
        self._absent.clear()
        self._failed = True

    def _leads(self) -> bool:
        """Whether this watcher leads now: it takes the lead when free, or at once when the
        leader's presence connection is gone (it died), rather than when its key lapses."""
        conn_id = self.presence.connection_id
        if conn_id is None:
            return False  # no presence: followers could not tell whether this leader lives
        mine = f"{self.s.holder} {conn_id}"
        args: list[str | int] = [self.s.holder, conn_id, LEADER_TTL_MS, ""]
        leader = _text(self._lead(keys=[self.leader_key], args=args))
        if leader != mine and self._leader_gone(leader):
            args[3] = leader
            leader = _text(self._lead(keys=[self.leader_key], args=args))
            if leader == mine:
                self._untraced_due = True
                log.info("deaths.lead_taken", dead_leader=leader_holder(args[3]))
        return leader == mine

    def _leader_gone(self, value: str) -> bool:
        """The leader's presence connection is no longer in Redis (one CLIENT LIST ID, whose
        cost does not grow with the deployment). A value without an id is kept to its TTL."""
        holder, _, conn_id = value.rpartition(" ")
        if not holder or not conn_id.isdigit():
            return False
        clients = self.s.redis.client_list(client_id=[conn_id])
        return not any(c.get("name") == connection_name(holder) for c in clients)

    def _due(self, holder: str, now: int) -> bool:
        """Absent since at least the grace, with no reconnect in between (epoch unchanged).
        A holder first seen absent counts from when Redis's own record says it was last
        present (its epoch's age, `presence.absent_for_ms`), not from this look: a watcher
        that starts, or takes the lead, after a holder died takes its work at once once that
        is past the grace, and a holder that only blipped was refreshing until its blip."""
        epoch, pttl = self.s.leases.presence_epoch(holder)
        seen = self._absent.get(holder)
        if seen is None or seen.epoch != epoch:
            seen = self._absent[holder] = _Absent(now - absent_for_ms(epoch, pttl), epoch)
        return now - seen.since_ms >= self.grace_ms

    def _look_for_untraced(self, report: DeathReport, now: int) -> None:
        """After a consumer's death, note the queued runs whose message the broker holds
        nowhere, at most once a grace, and at the next look publish again those still missing
        (`untraced.py`); a failed look is made again (the outbox stays the backstop)."""
        if self.traced is None:
            return
        try:
            if self._suspects is not None:
                report.republished += republish_untraced(self.s, self.traced, self._suspects)
                self._suspects = None
                return
            if not self._untraced_due or now - self._untraced_ms < self.grace_ms:
                return
            self._untraced_ms = now
            self._suspects = untraced(self.s, self.traced) or None
            self._untraced_due = False
        except (redis.RedisError, sa.exc.SQLAlchemyError) as exc:
            log.warning("deaths.untraced_failed", error=type(exc).__name__)

    def _take(self, holder: str, store_epoch: str, report: DeathReport) -> None:
        epoch = self._absent.pop(holder).epoch
        taken = self.s.leases.take_dead(holder, epoch)
        if taken is None:
            return  # it came back between the look and the take: alive after all
        tokens, reserved = taken
        if self.s.leases.store_epoch().id != store_epoch:
            # Redis lost its data right after the take: the holder may be taking its leases
            # back in the new one, where this take fences nothing. Its runs are left to the
            # sweeper's reconcile, which fences each missing key before it claims (I3).
            log.warning("deaths.take_abandoned", holder=holder, why="store epoch changed")
            self.s.leases.unfence(tokens)
            return
        report.dead.append(holder)
        report.claimed += claim_and_publish(self.s, tokens, Seen.CONNECTION_CLOSED, fenced=True)
        # A lease taken between its acquire and its claim leaves the run queued at that
        # attempt, and the acquire let the message's reservation go: it is published again
        # like a reserved one (claimed runs moved to the next attempt and are left alone).
        leased = [(t.run_id, t.attempt) for t in tokens]
        report.republished += republish_reserved(self.s, list(dict.fromkeys(reserved + leased)))


def leader_key(namespace: str) -> str:
    """The key naming the death watch's leader."""
    return f"{namespace}deaths:leader"


def leader_holder(value: str | int) -> str:
    """The holder a leader key's value names ("<holder> <connection id>")."""
    return str(value).rpartition(" ")[0]


def death_watch_leader(client: redis.Redis[bytes], namespace: str) -> str | None:
    """The holder whose death watch leads now, or None while none does."""
    raw = client.get(leader_key(namespace))
    return None if raw is None else leader_holder(_text(raw))


def hand_lead(client: redis.Redis[bytes], namespace: str, holder: str) -> bool:
    """Make `holder`'s death watch the leader now, naming one of its open connections (its
    watch renames it to its presence connection at its next look); False when it has none.
    The kill trials use it to kill a leading worker as often as a following one."""
    name = connection_name(holder)
    ids = [c["id"] for c in client.client_list() if c.get("name") == name]
    if not ids:
        return False
    client.set(leader_key(namespace), f"{holder} {ids[0]}", px=LEADER_TTL_MS)
    return True


def _text(raw: bytes | str | int) -> str:
    return raw.decode() if isinstance(raw, bytes) else str(raw)


def claim_and_publish(
    s: RecoveryDeps, tokens: list[Token], seen: Seen, *, fenced: bool = False
) -> list[str]:
    """Claim the lost attempts in Postgres in bounded batches (one statement each; of two
    claims one wins each run, I4) and publish each batch's new attempts in one round trip as
    soon as it commits, so a process that died holding hundreds of runs has its first ones
    resumed while the rest are claimed, with no statement locking them all at once. Audited
    as lost, with how the death was seen. `fenced`: the tokens' keys hold fences
    (`Leases.take_dead`), each batch's dropped once its claim is committed so the next
    attempts take their leases at once."""
    claimed: list[str] = []
    limit = s.timings.loss_limit
    for start in range(0, len(tokens), CLAIM_BATCH):
        chunk = tokens[start : start + CLAIM_BATCH]
        pairs = [(t.run_id, t.attempt) for t in chunk]
        # What the lost attempts reserved for steps they may not have written (one MGET).
        notes = usage_notes.read(s.redis, s.namespace, pairs)
        try:
            with s.engine.connect() as conn:
                claims = claim_lost_many(
                    conn, pairs, limit, seen=seen, ask_yields=s.resumed_first, notes=notes
                )
        finally:
            if fenced:  # committed, or failed (the sweeper claims them later)
                s.leases.unfence(chunk)
        for claim in claims:
            s.changes.announce(claim.run_id)
        s.leases.forget_steps([c.run_id for c in claims if c.status == RunStatus.FAILED])
        s.publisher.publish_many(
            [QueuedAttempt(c.run_id, c.attempt) for c in claims if c.status != RunStatus.FAILED]
        )
        for claim in claims:
            log.debug(  # `deaths.taken` and `deaths.pool_child` sum the claims up
                "deaths.claimed",
                run_id=claim.run_id,
                attempt=claim.attempt,
                status=claim.status,
                lost_count=claim.lost_count,
                seen=seen,
            )
        claimed += [c.run_id for c in claims]
    return claimed


def republish_reserved(s: RecoveryDeps, reserved: list[tuple[str, int]]) -> list[str]:
    """Messages a dead process had reserved (or leased without claiming their runs): publish
    again those whose runs are still queued at that attempt, at the head of the queue they had
    reached (a duplicate of a message that does arrive is dropped by the lease and the claim,
    I4)."""
    if not reserved:
        return []
    with s.engine.connect() as conn:
        again = [q._replace(redelivered=True) for q in still_queued(conn, reserved)]
    s.publisher.publish_many(again)
    return [q.run_id for q in again]


def claim_dead_child(s: RecoveryDeps, token: Token) -> list[str]:
    """A worker's main process saw the pool child holding `token` die: take its lease back
    (only if it still holds this token) and claim the run at once, without a sweep."""
    if not s.leases.take_token(token):
        return []
    return claim_and_publish(s, [token], Seen.POOL_CHILD_DIED)


class DeathWatchThread:
    """Runs the watch every `death_poll_ms` in a worker's main process (the leader key keeps
    it to one at a time across the deployment)."""

    def __init__(
        self, deps: RecoveryDeps, presence: Presence, traced: Traced | None = None
    ) -> None:
        self.watch = DeathWatch(deps, presence, traced)
        self.poll_ms = deps.timings.death_poll_ms
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="liyagent-deaths", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def _loop(self) -> None:
        # The first look at once: a worker that starts after another died takes its work now,
        # not a poll later.
        while True:
            try:
                self.watch.poll()
            except (redis.RedisError, OSError) as exc:
                self.watch.forget()
                log.warning("deaths.poll_failed", error=str(exc))
            except Exception:  # the watch must outlive any one bad poll
                log.exception("deaths.poll_error")
            if self._stop.wait(self.poll_ms / 1000):
                return


__all__ = [
    "DeathReport",
    "DeathWatch",
    "DeathWatchThread",
    "claim_and_publish",
    "claim_dead_child",
    "death_watch_leader",
    "hand_lead",
    "leader_holder",
    "leader_key",
    "republish_reserved",
]
