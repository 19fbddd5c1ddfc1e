"""A process's presence in Redis: how a dead process is seen at once, not after its lease.

Every engine process names its Redis connections after its holder (`CLIENT SETNAME
lya:<holder>`, the holder its lease tokens carry) and keeps one of them open, blocked, at all
times. A process that dies closes its connections, and Redis forgets them at once; the death
watch (`deaths.py`) sees a holder with no connection left and, after a short grace, claims its
runs. A process whose connection only blipped reconnects within the grace and is left alone.

The process side keeps that claim safe for vendors (I3): while its presence is down, its leases
count for at most the grace (less a margin) from the moment it lost it, so the send guard stops
it before any claim can happen; and when it reconnects it sets a new presence epoch
(`presence:epoch:<holder>`, a fresh random value) before trusting any renewal again. The death
watch deletes a holder's leases only while that epoch is unchanged (one Lua script), so either
the holder came back first (its leases are left alone) or its leases are gone and its renewals
fail. The epoch key is the only key named after a process that lives without work: it expires
`EPOCH_TTL_S` after its holder last refreshed it (every `BLOCK_S` while present), so a process
that is gone, however it went, leaves nothing behind in Redis (issue 31). Its value is random
rather than a counter so a key that lapsed and was made again never repeats a value the death
watch saw.

The refresh is also Redis's own record of when its holder was last present: the key's TTL says
when it was last refreshed, by Redis's clock (`absent_for_ms`), and a present holder refreshes
it at least every `STALE_MS`, a bound its epoch names (`new_epoch`). A death watch that starts
(or takes the lead) after a holder died therefore knows how long it has been absent without
having watched it (`deaths.py`); a process of an older release names no bound and is given the
whole grace from the look, as before. The holder keeps that record honest from its side: a
presence not refreshed for `STALE_MS` counts as lost from then (`absent_since_ms`), so its sends
stop within the grace of it, as they do after a loss it saw (a starved or stopped process
included).

On every (re)connect it also reads the store epoch (`leases.read_store_epoch`): a Redis that
lost its data (restarted empty, an empty replica promoted) shows a new epoch id, and only then
may the heartbeat take back, with SET NX of their own tokens, the leases Redis forgot
(`heartbeat.py`). Whoever waits on a reconnect (the heartbeat) is woken at once.
"""

from __future__ import annotations

import contextlib
import threading
import time
import uuid
from collections.abc import Callable

import redis
import structlog

from runtime.base.redis_clients import RedisTarget, client_for
from runtime.fleet.leases import CONNECTION_PREFIX, read_store_epoch
from runtime.fleet.tokens import add_consumer

log = structlog.get_logger(__name__)

# How long a holder with no connection is given before its runs are claimed: a blip (a
# restarted proxy, a failover) reconnects well within it; a dead process never does.
GRACE_MS = 1000
# The presence connection blocks this long per wait (its epoch is refreshed once per wait), and
# reconnects this often when down.
BLOCK_S = 1
RECONNECT_S = 0.1
# A present holder refreshes its epoch at least this often: a wait, and room for the round trip
# and a busy interpreter. Past it with no refresh, the holder counts as absent (both sides).
STALE_MS = BLOCK_S * 1000 + 1000
# The presence epoch lives this long past its holder's last refresh: many refreshes may be
# missed (a process starved of CPU) before it lapses.
EPOCH_TTL_S = 15
EPOCH_TTL_MS = EPOCH_TTL_S * 1000


class EpochLapsed(redis.RedisError):
    """This process's presence epoch lapsed while its connection stayed open (the process was
    stopped, or starved, past EPOCH_TTL_S): it is treated as a reconnect, so a new epoch is set
    and no renewal sent before it is trusted."""


def connection_name(holder: str) -> str:
    """The name every Redis connection of this holder carries (no spaces: CLIENT SETNAME)."""
    return f"{CONNECTION_PREFIX}{holder}"


def epoch_key(namespace: str, holder: str) -> str:
    return f"{namespace}presence:epoch:{holder}"


def _ms() -> int:
    return int(time.monotonic() * 1000)


def new_epoch() -> str:
    """A fresh presence epoch: random, carrying the refresh bound its holder keeps
    (`s<STALE_MS>:<hex>`), so a watcher judges each holder by the bound it really keeps (a
    process of an older release, refreshing less often, names none and is given the grace)."""
    return f"s{STALE_MS}:{uuid.uuid4().hex}"


def absent_for_ms(epoch: str, epoch_pttl_ms: int) -> int:
    """How long, at least, a holder with no connection has been absent by Redis's own record,
    from its epoch (the refresh bound it names) and the key's PTTL (each refresh sets it to
    EPOCH_TTL_MS). A key that is gone (-2) lapsed EPOCH_TTL_MS after its last refresh, one
    without a TTL (-1) or an epoch naming no bound says nothing (0). The holder counts itself
    absent from the same moment (`Presence.absent_since_ms`)."""
    if epoch_pttl_ms == -2:
        return EPOCH_TTL_MS - STALE_MS
    head, sep, _ = epoch.partition(":")
    if epoch_pttl_ms < 0 or not sep or not head[1:].isdigit() or not head.startswith("s"):
        return 0
    return max(EPOCH_TTL_MS - epoch_pttl_ms - int(head[1:]), 0)


class Presence:
    """This process's one blocked, named connection, and what its state means for sends."""

    def __init__(
        self, url: RedisTarget | str, namespace: str, holder: str, grace_ms: int = GRACE_MS
    ) -> None:
        self.url = url
        self.namespace = namespace
        self.holder = holder
        self.grace_ms = grace_ms
        self.up = False
        # Redis's id of the presence connection while it is up (CLIENT ID): the death watch's
        # leader names it, so the other watchers see the leader's death as soon as Redis does.
        self.connection_id: int | None = None
        # When the presence was last lost (not yet established counts from now), and since
        # when it is up again (monotonic ms).
        self.lost_at_ms = _ms()
        self.up_since_ms = 0
        # When the last refresh Redis answered was sent (monotonic ms): see `absent_since_ms`.
        self.refreshed_ms = 0
        # The store epoch id Redis showed at the last (re)connect ("" before the first): a
        # change means Redis lost its data meanwhile (see leases._EPOCH).
        self.store_epoch = ""
        self._on_up: list[Callable[[], None]] = []
        # The queues a worker's main process consumes (its `-Q`; empty: not a consumer): each
        # (re)connect puts it back among the consumers the death watch takes when they go, and
        # its queues among those the watch reads (after a cut it was taken for, or after Redis
        # lost its data).
        self.consumes: tuple[str, ...] = ()
        self._started = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._client: redis.Redis[bytes] | None = None

    def start(self, timeout_s: float = 5.0) -> None:
        """Start the presence thread (once per process) and wait until it is up, so leases
        taken after this are trusted from the start."""
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._loop, name="liyagent-presence", daemon=True
                )
                self._thread.start()
        self._started.wait(timeout_s)

    def stop(self) -> None:
        self._stop.set()

    def on_up(self, wake: Callable[[], None]) -> None:
        """Call `wake` (it must not block) each time the presence is (re)established."""
        self._on_up.append(wake)

    def close_inherited(self) -> None:
        """In a forked child (its services dropped, runtime/base/process.py): close the
        parent's presence socket here, so the parent's death is not hidden by a copy of its
        connection living on in the child. Never called in the process that owns it."""
        if self._client is not None:
            close_sockets_here(self._client)

    def absent_since_ms(self) -> int | None:
        """Since when (monotonic ms) this process counts as absent: its loss while down; while
        up, `STALE_MS` after its last refresh if none followed (a starved or stopped presence
        thread: a death watch reading the epoch's age may judge it absent from then); None
        while present."""
        if not self.up:
            return self.lost_at_ms
        stale_at = self.refreshed_ms + STALE_MS
        return stale_at if _ms() >= stale_at else None

    def cap_ms(self) -> int | None:
        """The latest monotonic moment this process may still write or send, by its presence:
        None while present; while absent, its grace from then, less the margin the lease check
        keeps (applied by the caller)."""
        since = self.absent_since_ms()
        return None if since is None else since + self.grace_ms

    def trusts(self, renewal_started_ms: int) -> bool:
        """Whether a lease renewal sent at this moment may extend a lease: only while present,
        and only if sent after the presence was (re)established and its epoch bumped."""
        return self.up and renewal_started_ms >= self.up_since_ms

    def _loop(self) -> None:
        while not self._stop.is_set():
            client: redis.Redis[bytes] | None = None
            try:
                client = self._client = client_for(
                    self.url,
                    client_name=connection_name(self.holder),
                    single_connection_client=True,  # one connection: the id below is its own
                    socket_timeout=BLOCK_S + 5,
                    socket_connect_timeout=2,
                    retry_on_timeout=False,
                )
                # The epoch first: a renewal is trusted only if sent after this.
                epoch = epoch_key(self.namespace, self.holder)
                sent_ms = _ms()
                client.set(epoch, new_epoch(), px=EPOCH_TTL_MS)
                self.store_epoch = read_store_epoch(client, self.namespace).id
                self.connection_id = int(client.client_id())
                self.refreshed_ms = sent_ms
                self.up_since_ms = _ms()  # renewals sent from now on follow the new epoch
                self.up = True
                self._started.set()
                if self.consumes:
                    add_consumer(client, self.namespace, self.holder, self.consumes)
                log.info("presence.up", holder=self.holder, store_epoch=self.store_epoch)
                for woken in self._on_up:
                    woken()
                wake = f"{self.namespace}presence:wake:{self.holder}"
                while not self._stop.is_set():
                    sent_ms = _ms()
                    if not client.pexpire(epoch, EPOCH_TTL_MS):
                        raise EpochLapsed(f"presence epoch of {self.holder} lapsed")
                    self.refreshed_ms = sent_ms
                    client.blpop([wake], timeout=BLOCK_S)
            except redis.RedisError as exc:
                self.connection_id = None
                if self.up:
                    # No later than it counted as absent already (a stale presence thread).
                    self.lost_at_ms = min(_ms(), self.refreshed_ms + STALE_MS)
                    self.up = False
                    log.warning("presence.lost", holder=self.holder, error=str(exc))
                self._started.set()  # a process that cannot reach Redis does not wait for it
                self._stop.wait(RECONNECT_S)
            finally:
                if client is not None:
                    client.close()


def close_sockets_here(client: redis.Redis[bytes]) -> None:
    """Close, in this process only, the sockets a forked child inherited with `client`: no
    word to Redis (the parent still uses them), no shutdown, just this process's descriptors.
    redis-py itself only drops them (its pool resets on a new pid), which keeps them open."""
    pool = client.connection_pool
    conns = [
        *getattr(pool, "_available_connections", []),
        *getattr(pool, "_in_use_connections", []),
    ]
    for conn in conns:
        sock = getattr(conn, "_sock", None)
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.close()
