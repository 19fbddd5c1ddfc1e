"""This process's view of the fleet's endpoint closes, pushed to it: no Redis round trip per step.

A close is stored in Redis and published (`gate.py`, `lua/close.lua`) with the ms it has left
(relative: each process counts it down on its own monotonic clock). One subscriber per process
(a daemon thread, started at the process's first model call) keeps a local map, profile ->
monotonic deadline, that a model step reads without any network. Each time its subscription is
confirmed (the first one, and again after any reconnect, redis-py's own included) it first reads
the closes in force (`lua/closes.lua`), so a close published while it was away is not missed.
Merges only ever lengthen a close, so a message and a read may arrive in any order.

The subscriber's connection is named `lya-flow:<holder>`, never `lya:<holder>`: the death watch
counts `lya:` connections as a holder's life (runtime/fleet/presence.py). A subscriber is an
optional, lazily started helper with a reconnect loop of its own: counted as life, a copy of a
parent's subscriber socket kept in a forked child, or one reconnecting late, could hide a dead
holder; and its absence (a process that never called a model, a subscription that broke) says
nothing about death either. Its distinct name still shows operators whose it is (CLIENT LIST).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from typing import Any

import redis

from runtime.base import process
from runtime.fleet.tokens import monotonic_ms

# How long the listener waits for a message per read (it also notices a stop then), and how
# long after a broken subscription before it subscribes again.
LISTEN_S = 1.0
RECONNECT_S = 0.2
# The process's first model call waits this long at most for the first read of the closes in
# force (a process started during a close must not send into it); Redis out of reach: it
# does not wait for it (fail open).
FIRST_SYNC_S = 2.0


def listener_name(holder: str) -> str:
    """The subscriber's connection name: its holder's, but not the death watch's `lya:` prefix
    (module docstring)."""
    return f"lya-flow:{holder}"


class Closes:
    """One process's local map of closed endpoints, kept current by one subscriber thread."""

    def __init__(
        self,
        listener: redis.Redis[bytes],
        channel: str,
        read: Callable[[], dict[str, int]],
        *,
        lost: Callable[[Exception], None],
        reached: Callable[[], None],
    ) -> None:
        # The client whose connection subscribes (its own, named apart from the holder's), the
        # channel, and the read of the closes in force (profile -> ms left, by Redis's clock).
        self.listener = listener
        self.channel = channel
        self.read = read
        self.lost = lost
        self.reached = reached
        self._fresh()
        # A forked child starts its own subscriber (runtime/base/process.py, `in_child`).
        process.track("runtime.flow.closes", "Closes", self)

    def _fresh(self) -> None:
        self._lock = threading.Lock()
        self._until: dict[str, int] = {}  # profile -> monotonic ms it stays closed until
        self._thread: threading.Thread | None = None
        self._synced = threading.Event()  # the first read done, or failed
        self._stop = threading.Event()
        self._pubsub: Any = None

    def left_ms(self, profile: str) -> int:
        """How many ms `profile`'s endpoint stays closed, as this process knows (no network)."""
        return max(0, self._until.get(profile, 0) - monotonic_ms())

    def note(self, profile: str, left_ms: int) -> None:
        """`profile` is closed for `left_ms` from now: never shortening a longer close."""
        if left_ms <= 0:
            return
        until = monotonic_ms() + left_ms
        with self._lock:
            if until > self._until.get(profile, 0):
                self._until[profile] = until

    def start(self) -> None:
        """Start the subscriber (once per process) and wait, the first time, for its first read
        of the closes in force (at most FIRST_SYNC_S; at once when Redis is out of reach)."""
        if self._thread is None:
            with self._lock:
                if self._thread is None:
                    self._thread = threading.Thread(
                        target=self._loop, name="liyagent-flow-closes", daemon=True
                    )
                    self._thread.start()
        if not self._synced.is_set():
            self._synced.wait(FIRST_SYNC_S)

    def stop(self) -> None:
        """Stop the subscriber (tests; a process's own ends with it)."""
        self._stop.set()

    def in_child(self) -> None:
        """In a forked child: the parent's subscriber thread is not here (threads do not survive
        a fork) and its socket is the parent's: closed here only, no word to Redis. The map is
        dropped; the child's first model call starts its own subscriber, which reads it anew."""
        connection = getattr(self._pubsub, "connection", None)
        sock = getattr(connection, "_sock", None)
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.close()
        self._fresh()

    def _loop(self) -> None:
        while not self._stop.is_set():
            pubsub = self._pubsub = self.listener.pubsub()
            try:
                pubsub.subscribe(self.channel)
                while not self._stop.is_set():
                    message = pubsub.get_message(timeout=LISTEN_S)
                    if message is None:
                        continue
                    if message["type"] == "subscribe":
                        self._sync()  # (re)subscribed: first read what was missed meanwhile
                    elif message["type"] == "message":
                        self._heard(message["data"])
            except Exception as exc:  # Redis away (or its client closed): admit until it is back
                self.lost(exc)
                self._synced.set()
            finally:
                with contextlib.suppress(Exception):  # a broken connection closes by itself
                    pubsub.close()
            self._stop.wait(RECONNECT_S)

    def _sync(self) -> None:
        for profile, left in self.read().items():
            self.note(profile, left)
        self._synced.set()
        self.reached()

    def _heard(self, data: bytes | str) -> None:
        """A close published: `<profile> <ms left>` (a profile may hold spaces, never last)."""
        text = data.decode() if isinstance(data, bytes) else data
        profile, _, left = text.rpartition(" ")
        if profile and left.isdigit():
            self.note(profile, int(left))
