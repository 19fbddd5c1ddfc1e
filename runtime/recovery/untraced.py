"""Run messages a dead worker took off the queue and left no trace of.

kombu's Redis transport takes a message off the queue's list (BRPOP) and only then, in a second
round trip, records it as delivered (`unacked`). A worker killed between the two has lost the
message from Redis: no list, no `unacked` entry, no reservation, no lease holds it, and its run
is still queued in Postgres. Without this the outbox would publish it again only after
`requeue_after_ms` (30 s). When the death watch sees a worker's main process die, it compares
the runs queued in Postgres since before the death grace with every message the broker holds
(in every queue a consumer takes from), and publishes again those held nowhere at two looks a
poll apart, at the head of the queue (they had reached it once).

A live worker's message is in no list or record only in that same moment, between its BRPOP
and its record: the second look tells it apart. One caught at both looks anyway (a worker
stalled that long) is published twice; the duplicate is dropped by the lease and the claim
(I4). Reading every held message costs Redis
a read of the whole queue, so above `TRACE_LIMIT` messages a death does not look (the outbox
still publishes such a run after `requeue_after_ms`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import structlog

from runtime.recovery.deps import RecoveryDeps
from store.rows import QueuedAttempt
from store.runs import queued_before, still_queued

log = structlog.get_logger(__name__)


@dataclass(frozen=True)
class Held:
    """Every run message (run id, attempt) the broker holds at one instant."""

    # Waiting in a queue's lists, not yet taken by a consumer.
    waiting: frozenset[tuple[str, int]]
    # Taken by a consumer and not acknowledged (kombu's `unacked`).
    delivered: frozenset[tuple[str, int]]


# A reader of what the broker holds now; None when it holds more messages than the limit given
# (tasks/deliveries.py `held_runs`).
Traced = Callable[[int], Held | None]

# The most messages a death's look reads from the broker (and queued runs from Postgres).
TRACE_LIMIT = 10_000


def untraced(s: RecoveryDeps, traced: Traced) -> set[tuple[str, int]] | None:
    """The runs queued before the death grace (a message lost in a death was published
    before it) whose message the broker holds nowhere now: one Redis snapshot (counted first,
    read only under the limit), one Postgres read. None when there are too many to read."""
    held = traced(TRACE_LIMIT)
    if held is None:
        log.info("deaths.untraced_not_read", why=f"more than {TRACE_LIMIT} messages queued")
        return None
    with s.engine.connect() as conn:
        queued = queued_before(conn, s.timings.death_grace_ms, TRACE_LIMIT)
    return {(q.run_id, q.attempt) for q in queued} - held.waiting - held.delivered


def republish_untraced(
    s: RecoveryDeps, traced: Traced, suspects: set[tuple[str, int]]
) -> list[str]:
    """Publish again, at the head of the queue, the suspects (missing at the look before)
    still missing now that no lease or reservation holds and whose runs are still queued. A
    live worker's message is missing only in its own moment between taking it off the queue
    and recording it: two looks a poll apart tell it from one a dead worker lost."""
    missing = untraced(s, traced)
    if missing is None:
        return []
    again = unheld(s, sorted(suspects & missing))
    s.publisher.publish_many(again)
    if again:
        log.info("deaths.untraced_published", runs=[q.run_id for q in again])
    return [q.run_id for q in again]


def unheld(s: RecoveryDeps, messages: list[tuple[str, int]]) -> list[QueuedAttempt]:
    """Of these messages (run id, attempt) the broker no longer holds, those no lease or
    reservation holds either and whose run is still queued at that attempt: what to publish
    again (the untraced ones here, the sweeper's orphaned deliveries), each redelivered (a
    dead worker took it off the queue: it goes back at the head)."""
    if not messages:
        return []
    leased = s.leases.alive([run_id for run_id, _ in messages])
    reserved = s.leases.all_reserved()
    left = [
        (r, a) for r, a in dict.fromkeys(messages) if r not in leased and f"{r}:{a}" not in reserved
    ]
    if not left:
        return []
    with s.engine.connect() as conn:
        return [q._replace(redelivered=True) for q in still_queued(conn, left)]


__all__ = ["TRACE_LIMIT", "Held", "Traced", "republish_untraced", "unheld", "untraced"]
