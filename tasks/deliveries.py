"""Run messages taken off the queue and not yet acknowledged, as the broker keeps them.

kombu's Redis transport records every message it hands to a consumer in the `unacked` hash
(delivery tag -> the raw message) and its delivery time in `unacked_index`, both under the
deployment's key prefix, until the message is acknowledged (`task_acks_late`: when its task
ends). A worker killed between taking a message and reserving it leaves its run queued with no
trace but this one; the sweeper reads it here (runtime/recovery/sweeper.py `_orphaned`).
A worker killed between its BRPOP and that record leaves no trace at all: the death watch
reads every message the broker holds to find it (runtime/recovery/untraced.py), and the outbox
reads the waiting ones to publish again only runs whose message waits nowhere.
"""

from __future__ import annotations

import base64
import json
import time
from typing import Any

import redis

from runtime.fleet.tokens import queues_key, text_of
from runtime.flow.order import bucket_keys
from runtime.recovery.deps import RecoveryDeps
from runtime.recovery.sweeper import Deliveries, Sweeper
from runtime.recovery.untraced import Held, Traced
from runtime.services import Services
from tasks.services import RUN_TASK

# kombu's hash of the messages delivered and not acknowledged, under a deployment's prefix.
UNACKED = "unacked"


def unacked_runs(client: redis.Redis[bytes], namespace: str) -> Deliveries:
    """A reader of the run messages delivered between `newer_than_s` and `older_than_s` ago and
    not acknowledged since: (run id, attempt) each. Unreadable entries are skipped."""

    def read(older_than_s: float, newer_than_s: float) -> list[tuple[str, int]]:
        now = time.time()
        tags = client.zrangebyscore(
            f"{namespace}{UNACKED}_index", now - newer_than_s, now - older_than_s
        )
        if not tags:
            return []
        found = []
        for raw in client.hmget(f"{namespace}{UNACKED}", tags):
            run = _run_of(raw)
            if run is not None:
                found.append(run)
        return found

    return read


def _run_of(raw: bytes | None) -> tuple[str, int] | None:
    """The (run id, attempt) of one unacknowledged message (kombu stores `[message,
    exchange, routing key]`), or None if it is not a run message."""
    if raw is None:
        return None
    try:
        return _run_of_payload(json.loads(raw)[0])
    except (ValueError, KeyError, TypeError, IndexError, AttributeError):
        return None


def _run_of_message(raw: bytes) -> tuple[str, int] | None:
    """The (run id, attempt) of one message waiting in a queue's list, or None."""
    try:
        return _run_of_payload(json.loads(raw))
    except (ValueError, KeyError, TypeError, IndexError, AttributeError):
        return None


def _run_of_payload(payload: dict[str, Any]) -> tuple[str, int] | None:
    """The (run id, attempt) a message's payload carries, or None if it is not a run's
    (raises on a malformed one: the callers skip it)."""
    if payload["headers"].get("task") != RUN_TASK:
        return None
    body = payload["body"]
    if payload["properties"].get("body_encoding") == "base64":
        body = base64.b64decode(body)
    args = json.loads(body)[0]
    return str(args[0]), int(args[1])


def held_runs(client: redis.Redis[bytes], namespace: str, queue: str) -> Traced:
    """A reader of every run message the broker holds now, in one snapshot (MULTI): those
    waiting in any queue a consumer takes from (`holders:queues`, with the runs' own `queue`;
    one list per priority bucket) and those delivered and not acknowledged. A queue left out
    would make every run waiting in it look lost. None when they number more than `limit`
    (reading them all would cost Redis too much at once); unreadable entries are skipped."""
    unacked = f"{namespace}{UNACKED}"

    def read(limit: int) -> Held | None:
        queues = {text_of(q) for q in client.smembers(queues_key(namespace))} | {queue}
        keys = [key for q in sorted(queues) for key in bucket_keys(f"{namespace}{q}")]
        pipe = client.pipeline(transaction=True)
        for key in keys:
            pipe.llen(key)
        pipe.hlen(unacked)
        if sum(int(n) for n in pipe.execute()) > limit:
            return None
        for key in keys:
            pipe.lrange(key, 0, -1)
        pipe.hvals(unacked)
        *lists, unacked_values = pipe.execute()
        waiting = {_run_of_message(raw) for raws in lists for raw in raws}
        delivered = {_run_of(raw) for raw in unacked_values}
        return Held(
            waiting=frozenset(run for run in waiting if run is not None),
            delivered=frozenset(run for run in delivered if run is not None),
        )

    return read


def broker_sweeper(s: Services) -> Sweeper:
    """This process's sweeper, reading what the broker holds: the deliveries a dead worker
    left unreserved, and the waiting messages the outbox must not publish again."""
    ns, queue = s.settings.namespace, s.settings.queue
    return Sweeper(RecoveryDeps.of(s), unacked_runs(s.redis, ns), held_runs(s.redis, ns, queue))
