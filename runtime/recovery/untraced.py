"""Run messages a dead worker took off the queue and left no trace of.

kombu's Redis transport takes a message off the queue's list (BRPOP) and only then, in a second
round trip, records it as delivered (`unacked`). A worker killed between the two has lost the
message from Redis: no list, no `unacked` entry, no reservation, no lease holds it, and its run
is still queued in Postgres. Without this the outbox would publish it again only after
`requeue_after_ms` (30 s). When the death watch sees a worker die, it compares the runs queued
in Postgres with every message the broker holds, and publishes again at once those held nowhere.

A run whose message is in a live worker's same window at that instant is published twice; the
duplicate is dropped by the lease and the claim (I4). Reading every held message costs Redis
a read of the whole queue, so above `TRACE_LIMIT` messages a death does not look (the outbox
still publishes such a run after `requeue_after_ms`).
"""

from __future__ import annotations

from collections.abc import Callable

import structlog

from runtime.recovery.deps import RecoveryDeps
from store.runs import queued_before, still_queued

log = structlog.get_logger(__name__)

# Every run message the broker holds now (run id, attempt): waiting in the queue or delivered
# and not acknowledged; None when there are more than the limit given (tasks/deliveries.py).
Traced = Callable[[int], set[tuple[str, int]] | None]

# The most messages a death's look reads from the broker (and queued runs from Postgres).
TRACE_LIMIT = 20_000
# A run queued this recently may still be on its way to the queue (stored, not yet published).
PUBLISHING_MS = 200


def republish_untraced(s: RecoveryDeps, traced: Traced) -> list[str]:
    """Publish again the queued runs whose message no list, delivery, reservation or lease
    holds (one Postgres read, one Redis snapshot, a recheck that each is still queued)."""
    with s.engine.connect() as conn:
        queued = queued_before(conn, PUBLISHING_MS, TRACE_LIMIT + 1)
    if not queued:
        return []
    held = traced(TRACE_LIMIT) if len(queued) <= TRACE_LIMIT else None
    if held is None:
        log.info("deaths.untraced_not_read", why=f"more than {TRACE_LIMIT} messages queued")
        return []
    reserved = s.leases.all_reserved()
    leased = s.leases.alive([q.run_id for q in queued])
    nowhere = [
        (q.run_id, q.attempt)
        for q in queued
        if (q.run_id, q.attempt) not in held
        and f"{q.run_id}:{q.attempt}" not in reserved
        and q.run_id not in leased
    ]
    if not nowhere:
        return []
    with s.engine.connect() as conn:
        again = still_queued(conn, nowhere)
    s.publisher.publish_many(again)
    if again:
        log.info("deaths.untraced_published", runs=[q.run_id for q in again])
    return [q.run_id for q in again]


__all__ = ["PUBLISHING_MS", "TRACE_LIMIT", "Traced", "republish_untraced"]
