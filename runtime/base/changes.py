""" "Run X changed": the nudge that wakes whoever follows a run's events, so nobody polls
Postgres per follower. Postgres stays the only source of truth; a nudge carries no event,
only a run id, and only wakes readers, who then read the run's new rows after the sequence
number they hold (runtime/ops/events.py). A nudge lost (Redis away, a process dying between
its commit and its nudge) only delays: followers read again on a bounded interval anyway.

The engine calls `announce(run_id)` after a statement that makes an event commits. It costs
the step nothing: no network, no lock held; one thread per process publishes what was
announced, several runs in one `PUBLISH`, on one channel (`<namespace>run-changes`). One
subscription per process (started on first `watch`) fans each nudge out to the watches of
that run: 500 followers in one front are one Redis connection and no database connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import redis
import structlog

from runtime.base import process

log = structlog.get_logger(__name__)

# How many runs one PUBLISH carries at most, and how long the listener blocks per read (it
# also notices a closed connection then).
BATCH = 500
LISTEN_S = 1.0
# After the subscription broke, how long before it is opened again.
RECONNECT_S = 0.5


class Watch:
    """A follower's interest in one run: set by every nudge of it (and when the subscription
    was reopened, since nudges may have been missed). Clear it, read, then wait: a nudge that
    came after the clear is never missed."""

    def __init__(self, run_id: str) -> None:
        self.run_id = run_id
        self._flag = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._event: asyncio.Event | None = None

    def nudge(self) -> None:
        """Wake the follower (from any thread)."""
        self._flag.set()
        loop, event = self._loop, self._event
        if loop is not None and event is not None:
            # A closed loop: nobody waits on it any more.
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(event.set)

    def clear(self) -> None:
        """Forget the nudges so far (before reading)."""
        self._flag.clear()
        if self._event is not None:
            self._event.clear()

    def wait(self, timeout_s: float) -> bool:
        """Block until nudged or `timeout_s` passed; whether it was nudged."""
        return self._flag.wait(timeout_s)

    async def wait_async(self, timeout_s: float) -> bool:
        """`wait` for asyncio: holds no thread while it waits."""
        if self._event is None:
            self._loop, self._event = asyncio.get_running_loop(), asyncio.Event()
        if self._flag.is_set():
            return True
        try:
            await asyncio.wait_for(self._event.wait(), timeout_s)
        except TimeoutError:
            return self._flag.is_set()
        return True


class RunChanges:
    """One process's side of the nudges: announcing (the engine) and watching (followers)."""

    def __init__(self, client: redis.Redis[bytes] | None, namespace: str) -> None:
        # None: nothing is published or heard (followers read on their interval alone).
        self.client = client
        self.channel = f"{namespace}run-changes"
        self._lock = threading.Lock()
        self._publishing = False
        self._outbox: queue.SimpleQueue[str] = queue.SimpleQueue()
        self._watches: dict[str, set[Watch]] = {}
        self._listening = False
        # A forked child starts its own publisher (runtime/base/process.py, `in_child`).
        process.track("runtime.base.changes", "RunChanges", self)

    # The engine's side.

    def announce(self, run_id: str) -> None:
        """Say that run `run_id` has a new record (call it after the commit). Never blocks,
        never raises: a nudge is a hint."""
        if self.client is None:
            return
        self._local(run_id)
        self._start_publisher()
        self._outbox.put(run_id)

    def _start_publisher(self) -> None:
        if self._publishing:
            return
        with self._lock:
            if self._publishing:
                return
            threading.Thread(target=self._publish_loop, name="run-changes-pub", daemon=True).start()
            self._publishing = True

    def in_child(self) -> None:
        """In a forked child: the parent's publisher thread is not here (threads do not survive
        a fork), so the first nudge starts this process's own, on an outbox of its own."""
        self._lock, self._outbox, self._publishing = threading.Lock(), queue.SimpleQueue(), False

    def _publish_loop(self) -> None:
        outbox, client = self._outbox, self.client
        assert client is not None
        while True:
            ids = {outbox.get()}
            while len(ids) < BATCH:
                try:
                    ids.add(outbox.get_nowait())
                except queue.Empty:
                    break
            try:
                client.publish(self.channel, " ".join(sorted(ids)))
            except redis.RedisError as exc:  # followers read again on their interval
                log.info("run_changes.publish_failed", error=type(exc).__name__, runs=len(ids))

    # The followers' side.

    @contextmanager
    def watch(self, run_id: str) -> Iterator[Watch]:
        """A watch on one run for as long as the block lasts."""
        w = self.open(run_id)
        try:
            yield w
        finally:
            self.close(w)

    def open(self, run_id: str) -> Watch:
        """A watch on one run until `close` (for a watch that outlives a block: one handed
        from a request to its response's stream); prefer `watch`."""
        w = Watch(run_id)
        with self._lock:
            self._watches.setdefault(run_id, set()).add(w)
        self._start_listener()
        return w

    def close(self, w: Watch) -> None:
        """Stop a watch `open` gave (again: nothing)."""
        with self._lock:
            watches = self._watches.get(w.run_id)
            if watches is not None:
                watches.discard(w)
                if not watches:
                    del self._watches[w.run_id]

    def watching(self) -> int:
        """How many watches are open (for tests and metrics)."""
        with self._lock:
            return sum(len(w) for w in self._watches.values())

    def _local(self, run_id: str) -> None:
        """A follower in this very process hears its own process at once."""
        with self._lock:
            watches = list(self._watches.get(run_id, ()))
        for w in watches:
            w.nudge()

    def _start_listener(self) -> None:
        if self.client is None or self._listening:
            return
        with self._lock:
            if self._listening:
                return
            self._listening = True
        threading.Thread(target=self._listen_loop, name="run-changes-sub", daemon=True).start()

    def _listen_loop(self) -> None:
        assert self.client is not None
        while True:
            pubsub = self.client.pubsub(ignore_subscribe_messages=True)
            try:
                pubsub.subscribe(self.channel)
                self._nudge_all()  # nudges sent while it was not subscribed were missed
                while True:
                    message = pubsub.get_message(timeout=LISTEN_S)
                    if message is not None and message.get("type") == "message":
                        self._heard(message["data"])
            except Exception as exc:  # Redis away, or its client closed: subscribe again
                log.info("run_changes.listen_broke", error=type(exc).__name__)
            finally:
                _close_quietly(pubsub)
            threading.Event().wait(RECONNECT_S)

    def _heard(self, data: Any) -> None:
        text = data.decode() if isinstance(data, bytes) else str(data)
        for run_id in text.split():
            self._local(run_id)

    def _nudge_all(self) -> None:
        with self._lock:
            watches = [w for ws in self._watches.values() for w in ws]
        for w in watches:
            w.nudge()


def _close_quietly(pubsub: Any) -> None:
    with contextlib.suppress(Exception):  # a broken connection closes by itself
        pubsub.close()
