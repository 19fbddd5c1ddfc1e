"""This process's view of the fleet's endpoint closes, pushed to it: no Redis round trip per step.

A close is stored in Redis and published (`gate.py`, `lua/close.lua`) with the ms it has left
(relative: each process counts it down on its own monotonic clock). One subscriber per process
(a daemon thread, started at the process's first model call) keeps a local map, profile ->
monotonic deadline, that a model step reads without any network. Each time its subscription is
confirmed (the first one, and again after any reconnect, redis-py's own included) it first reads
the closes in force (`lua/closes.lua`), so a close published while it was away is not missed.
Merges only ever lengthen a close, so a message and a read may arrive in any order.

The subscriber's connection is named `lya-flow:<holder>`, never `lya:<holder>`
(runtime/base/listening.py says why); its distinct name still shows operators whose it is.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import redis

from runtime.base import process
from runtime.base.listening import Subscriber
from runtime.fleet.tokens import monotonic_ms

# The process's first model call waits this long at most for the first read of the closes in
# force (a process started during a close must not send into it); Redis out of reach: it
# does not wait for it (fail open).
FIRST_SYNC_S = 2.0


def listener_name(holder: str) -> str:
    """The subscriber's connection name: its holder's, but not the death watch's `lya:` prefix
    (runtime/base/listening.py)."""
    return f"lya-flow:{holder}"


class Closes(Subscriber):
    """One process's local map of closed endpoints, kept current by one subscriber thread."""

    thread_name = "liyagent-flow-closes"

    def __init__(
        self,
        listener: redis.Redis[bytes],
        channel: str,
        read: Callable[[], dict[str, int]],
        *,
        lost: Callable[[Exception], None],
        reached: Callable[[], None],
    ) -> None:
        # The read of the closes in force (profile -> ms left, by Redis's clock).
        self.read = read
        self._on_lost = lost
        self.reached = reached
        super().__init__(listener, channel)
        # A forked child starts its own subscriber (runtime/base/process.py, `in_child`).
        process.track("runtime.flow.closes", "Closes", self)

    def _fresh(self) -> None:
        super()._fresh()
        self._until: dict[str, int] = {}  # profile -> monotonic ms it stays closed until
        self._synced = threading.Event()  # the first read done, or failed

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
        super().start()
        if not self._synced.is_set():
            self._synced.wait(FIRST_SYNC_S)

    def in_child(self) -> None:
        """In a forked child: the map is dropped with the parent's subscriber; the child's first
        model call starts its own subscriber, which reads it anew."""
        super().in_child()

    def lost(self, exc: Exception) -> None:
        """Redis away (or its client closed): admit until it is back."""
        self._on_lost(exc)
        self._synced.set()

    def subscribed(self) -> None:
        """(Re)subscribed: first read what was missed meanwhile."""
        for profile, left in self.read().items():
            self.note(profile, left)
        self._synced.set()
        self.reached()

    def heard(self, data: bytes | str) -> None:
        """A close published: `<profile> <ms left>` (a profile may hold spaces, never last)."""
        text = data.decode() if isinstance(data, bytes) else data
        profile, _, left = text.rpartition(" ")
        if profile and left.isdigit():
            self.note(profile, int(left))
