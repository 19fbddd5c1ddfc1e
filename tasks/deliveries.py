"""Run messages taken off the queue and not yet acknowledged, as the broker keeps them.

kombu's Redis transport records every message it hands to a consumer in the `unacked` hash
(delivery tag -> the raw message) and its delivery time in `unacked_index`, both under the
deployment's key prefix, until the message is acknowledged (`task_acks_late`: when its task
ends). A worker killed between taking a message and reserving it leaves its run queued with no
trace but this one; the sweeper reads it here (runtime/recovery/sweeper.py `_orphaned`).
"""

from __future__ import annotations

import base64
import json
import time

import redis

from runtime.recovery.sweeper import Deliveries
from tasks.services import RUN_TASK


def unacked_runs(client: redis.Redis[bytes], namespace: str) -> Deliveries:
    """A reader of the run messages delivered between `newer_than_s` and `older_than_s` ago and
    not acknowledged since: (run id, attempt) each. Unreadable entries are skipped."""

    def read(older_than_s: float, newer_than_s: float) -> list[tuple[str, int]]:
        now = time.time()
        tags = client.zrangebyscore(
            f"{namespace}unacked_index", now - newer_than_s, now - older_than_s
        )
        if not tags:
            return []
        found = []
        for raw in client.hmget(f"{namespace}unacked", tags):
            run = _run_of(raw)
            if run is not None:
                found.append(run)
        return found

    return read


def _run_of(raw: bytes | None) -> tuple[str, int] | None:
    """The (run id, attempt) of one stored message, or None if it is not a run message."""
    if raw is None:
        return None
    try:
        payload = json.loads(raw)[0]
        if payload["headers"].get("task") != RUN_TASK:
            return None
        body = payload["body"]
        if payload["properties"].get("body_encoding") == "base64":
            body = base64.b64decode(body)
        args = json.loads(body)[0]
        return str(args[0]), int(args[1])
    except (ValueError, KeyError, TypeError, IndexError, AttributeError):
        return None
