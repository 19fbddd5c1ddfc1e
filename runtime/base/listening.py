"""One Redis subscriber thread per purpose and process, with its reconnect loop in one home.

A subscriber is an optional, lazily started helper: what it hears makes a process act sooner
(an endpoint closed, a run stopped), and what it misses is covered by a slower path of its own
(a read of the closes in force, a lease renewal that finds the key gone). Its connection is
named apart from the holder's (`lya-<purpose>:<holder>`, never `lya:`): the death watch counts
`lya:` connections as a holder's life (runtime/fleet/presence.py), and a subscriber's socket,
kept in a forked child or reconnecting late, must never hide a dead holder.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Any

import redis

# How long the listener waits for a message per read (it also notices a stop then), and how
# long after a broken subscription before it subscribes again.
LISTEN_S = 1.0
RECONNECT_S = 0.2


class Subscriber:
    """A daemon thread subscribed to one channel: `subscribed` after each (re)subscription,
    `heard` for each message, `lost` when the subscription broke (it subscribes again)."""

    thread_name = "liyagent-subscriber"

    def __init__(self, listener: redis.Redis[bytes], channel: str) -> None:
        self.listener = listener
        self.channel = channel
        self._fresh()

    def _fresh(self) -> None:
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._pubsub: Any = None

    def subscribed(self) -> None:
        """The subscription is (again) confirmed: catch up with what was missed meanwhile."""

    def heard(self, data: bytes | str) -> None:
        """One message published on the channel."""

    def lost(self, exc: Exception) -> None:
        """The subscription broke (Redis away or its client closed)."""

    def start(self) -> None:
        """Start the subscriber thread, once per process (a forked child starts its own)."""
        if self._thread is None:
            with self._lock:
                if self._thread is None:
                    self._thread = threading.Thread(
                        target=self._loop, name=self.thread_name, daemon=True
                    )
                    self._thread.start()

    def stop(self) -> None:
        """Stop the subscriber (tests; a process's own ends with it)."""
        self._stop.set()

    def in_child(self) -> None:
        """In a forked child: the parent's subscriber thread is not here (threads do not survive
        a fork) and its socket is the parent's: closed here only, no word to Redis."""
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
                        self.subscribed()
                    elif message["type"] == "message":
                        self.heard(message["data"])
            except Exception as exc:  # Redis away (or its client closed): the slow path covers
                self.lost(exc)
            finally:
                with contextlib.suppress(Exception):  # a broken connection closes by itself
                    pubsub.close()
            self._stop.wait(RECONNECT_S)
