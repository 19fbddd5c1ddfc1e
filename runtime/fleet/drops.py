"""This process hears, within milliseconds, that runs it holds ended outside their attempts.

A Stop, an erasure or a sweep's loss limit fences a running attempt in Postgres and drops its
lease in Redis, and publishes the run ids on `leases:dropped` (`LeaseLife.forget_steps`). One
subscriber per worker process (started with its heartbeat) loses the leases it holds of those
runs at once: their requests in flight are cut (runtime/sending/in_flight.py) and they send and
write nothing more. A message missed (the subscriber away, Redis failing over) costs only time:
the heartbeat's next renewal finds the key gone (or fenced, for a run handed to a new attempt)
and loses the lease then.
"""

from __future__ import annotations

from collections.abc import Callable

import redis
import structlog

from runtime.base import process
from runtime.base.listening import Subscriber

log = structlog.get_logger(__name__)

# What a lease lost this way says (its attempt's errors and logs carry it).
WHY = "its run was ended outside this attempt (a Stop, an erasure or its loss limit)"


def listener_name(holder: str) -> str:
    """The drop watch's connection name, apart from the death watch's `lya:` prefix."""
    return f"lya-drops:{holder}"


class DropWatch(Subscriber):
    """The subscriber to `leases:dropped`; `lose` is its heartbeat's (`Heartbeat.lose_runs`)."""

    thread_name = "liyagent-lease-drops"

    def __init__(self, listener: redis.Redis[bytes], channel: str) -> None:
        super().__init__(listener, channel)
        self.lose: Callable[[dict[str, int | None], str], list[str]] = lambda runs, why: []
        # A forked child starts its own with its own heartbeat (runtime/base/process.py).
        process.track("runtime.fleet.drops", "DropWatch", self)

    def heard(self, data: bytes | str) -> None:
        """Runs separated by spaces, each `<run id>` (every attempt of it) or `<run id>:<n>`
        (its attempts before n): lose the leases held here of those attempts."""
        text = data.decode() if isinstance(data, bytes) else data
        runs: dict[str, int | None] = {}
        for item in text.split():
            run_id, _, below = item.partition(":")
            runs[run_id] = int(below) if below.isdigit() else None
        if runs and (lost := self.lose(runs, WHY)):
            log.info("lease.dropped", run_ids=lost)
