"""The order runs are served in: a run already partly done (lost and claimed, handed back at a
warm shutdown, given back after a store fault, woken from a wait, yielded) comes before runs
that have not started, on every pool, whatever the backlog.

Every resume bumps the run's attempt, so attempt > 1 means resumed: the rule needs nothing but
the attempt a message carries. The order is the broker's: kombu's Redis transport keeps one
list per priority bucket of each queue and pops the buckets in order (0 first) across every
queue a worker consumes, so a message in bucket 0 is taken before any in a later bucket. New
runs go to `NEW`; resumed runs, messages published again after a dead worker took them off the
queue, and every message that names no priority (the operator's sweeps, cron fires: never
starved by a backlog of new runs), to bucket 0.
"""

from __future__ import annotations

from runtime.base.tenancy import HIGH, LOW, NORMAL

# kombu's Redis priority buckets (its default `priority_steps`): 0 is served first.
PRIORITY_STEPS = (0, 3, 6, 9)
# A resumed run's bucket: first, with the messages that name no priority.
RESUMED = 0
# A run that has not started, at normal priority: behind every resumed run.
NEW = 6
# A first attempt's bucket by its run's priority (1 low, 2 normal, 3 high: runtime/base/
# tenancy.py): the three buckets after the resumed runs', so the broker keeps them apart.
FIRST_BY_PRIORITY = {HIGH: 3, NORMAL: NEW, LOW: 9}


def priority(
    attempt: int, resumed_first: bool = True, run_priority: int = NORMAL, redelivered: bool = False
) -> int | None:
    """The priority to publish attempt `attempt` of a run with: `RESUMED` for a resumed one
    (attempt > 1) or a message published again after a dead worker took it off the queue
    (`redelivered`: it had reached the head of the queue once), a first attempt's bucket by its
    run's priority (`NEW` at normal); None (the broker's default bucket, 0, for all: one FIFO)
    when the order is off (LIYAGENT_RESUMED_FIRST=false). Never refuses: a message is a hint,
    and one for an attempt that cannot be (a test's stale message) is dropped by its claim."""
    if not resumed_first:
        return None
    if attempt > 1 or redelivered:
        return RESUMED
    return FIRST_BY_PRIORITY.get(run_priority, NEW)


# kombu's Redis transport names a queue's bucket n > 0 `<queue>\x06\x16<n>` (bucket 0 is the
# queue's own name).
BUCKET_SEP = "\x06\x16"


def bucket_keys(queue_key: str) -> list[str]:
    """The Redis lists holding a queue's messages (`queue_key`: its key, namespace included),
    one per priority bucket, in the order a worker pops them: what an operator or a test reads
    to see every message the queue holds."""
    return [queue_key if pri == 0 else f"{queue_key}{BUCKET_SEP}{pri}" for pri in PRIORITY_STEPS]
