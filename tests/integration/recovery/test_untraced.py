"""What the death watch's look for messages a dying worker took off the queue and recorded
nowhere (runtime/recovery/untraced.py) must not publish again: a run waiting in another queue a
consumer takes from, and a live worker's message caught between its BRPOP and its record at one
look only. (That it does publish a message lost so: tests/integration/recovery/test_deaths.py.)
Real Redis lists and kombu's own `unacked` records; judged from the broker and Postgres."""

from __future__ import annotations

import base64
import json
import re
import time

import pytest
import sqlalchemy as sa

from runtime.fleet.presence import EPOCH_TTL_MS, STALE_MS, epoch_key, new_epoch
from runtime.fleet.tokens import add_consumer
from runtime.flow.order import bucket_keys
from runtime.recovery.deaths import DeathWatch, death_watch_leader, hand_lead
from runtime.recovery.deps import RecoveryDeps
from runtime.services import holder_of
from tasks.deliveries import UNACKED, held_runs
from tests.support.judge import judge_runs, wait_all
from tests.support.scripts import mixed
from tests.support.stack import RecordingPublisher, services_with

pytestmark = pytest.mark.kill

# The outbox out of the way: only the death watch could publish a message again.
QUIET = {"LIYAGENT_REQUEUE_AFTER_MS": "600000"}


def _until(check, what: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def _run_of(raw: bytes) -> str:
    """The run id a queued message carries (kombu's payload, its body base64 JSON)."""
    return str(json.loads(base64.b64decode(json.loads(raw)["body"]))[0][0])


def test_a_run_waiting_in_another_consumed_queue_is_not_taken_for_lost(stack) -> None:
    # A consumer of another queue is busy with its one slot (kombu takes nothing more off its
    # queue meanwhile), a run waiting behind. A worker of the runs' queue dies holding a run;
    # the survivor's look after that death reads every queue a consumer takes from
    # (`holders:queues`), so the waiting run is held, not published again into the runs' queue.
    leases = stack.services.leases
    leases.mark_epoch(leases.store_epoch(), "requeued")
    client = stack.services.redis
    ns = stack.settings.namespace
    other = f"{stack.settings.queue}.other"
    ours, theirs = bucket_keys(f"{ns}{stack.settings.queue}"), bucket_keys(f"{ns}{other}")

    def to_other(run_id: str) -> int:
        """Its message moved to the other queue's same bucket, as a client of that queue
        publishes it; the bucket's index."""
        [index] = [i for i, key in enumerate(ours) if client.llen(key)]
        client.lpush(theirs[index], client.rpop(ours[index]))
        return index

    stack.worker("elsewhere", queue=other, ops=False, env=QUIET, sweeps=False, concurrency=1)
    _until(lambda: other.encode() in client.smembers(f"{ns}holders:queues"), "never consumed")
    busy = stack.start(mixed("busy", latency_ms=6000))
    to_other(busy)
    _until(lambda: stack.client.get(busy).status == "running", "the other queue's never ran")
    waiting = stack.start(mixed("waiting"))
    index = to_other(waiting)
    victim = stack.worker("victim", env=QUIET, sweeps=False)
    victim_holder = holder_of(victim.popen.pid)
    held = stack.start(mixed("held", latency_ms=2000))
    _until(lambda: stack.client.get(held).status == "running", "the victim never ran it")
    survivor = stack.worker("survivor", env=QUIET, sweeps=False)
    holder = holder_of(survivor.popen.pid)
    _until(lambda: hand_lead(client, ns, holder), "the survivor never named its connections")
    _until(lambda: death_watch_leader(client, ns) == holder, "the survivor never led")
    time.sleep(1.0)  # four looks: the survivor has seen the victim consuming
    victim.kill()
    survivor.wait_for(rf"{re.escape(victim_holder)}[^\n]*\"deaths.taken\"", timeout=20)
    time.sleep(1.0)  # four looks more: the look after the death and the one confirming it
    assert stack.client.get(busy).status == "running", "too slow a host to judge: busy ended"
    assert "deaths.untraced_published" not in survivor.output()
    view = stack.client.get(waiting)
    assert (view.status, view.attempt) == ("queued", 1)
    assert [_run_of(m) for m in client.lrange(theirs[index], 0, -1)] == [waiting]
    wait_all(stack, [busy, waiting, held], timeout=120)
    judge_runs(stack, [busy, waiting, held]).assert_clean()


def test_a_message_missing_at_one_look_only_is_not_published_again(stack) -> None:
    # Three runs queued before the grace, when a dead consumer is taken. At the death's first
    # look two messages are in no list or record, taken off the queue (kombu's BRPOP): one by a
    # live worker, which records it (`unacked`) before the next look: left alone; the other is
    # still nowhere at the next look: published again, at the head of the queue. The third is
    # in the queue at the first look and taken by a live worker just before the next one:
    # missing at one look only, left alone too.
    leases = stack.services.leases
    leases.mark_epoch(leases.store_epoch(), "requeued")
    client = stack.services.redis
    ns = stack.settings.namespace
    queue = stack.settings.queue
    runs = [stack.start(mixed(tag)) for tag in ("passing", "lost", "late")]
    with stack.engine.begin() as conn:
        conn.execute(
            sa.text(
                "UPDATE runs SET queued_at = now() - interval '5 seconds' "
                "WHERE id = ANY(CAST(:ids AS uuid[]))"
            ),
            {"ids": runs},
        )
    [key] = [key for key in bucket_keys(f"{ns}{queue}") if client.llen(key)]
    taken = {_run_of(raw): raw for raw in [client.rpop(key), client.rpop(key)]}
    passing, lost, late = runs
    assert sorted(taken) == sorted([passing, lost])
    # A consumer whose process died a while ago (its presence epoch stale, no connection).
    add_consumer(client, ns, "ghost-1", (queue,))
    grace = stack.settings.timings.death_grace_ms
    client.set(epoch_key(ns, "ghost-1"), new_epoch(), px=EPOCH_TTL_MS - STALE_MS - grace - 500)
    publisher = RecordingPublisher()
    s = services_with(stack, publisher)
    watch = DeathWatch(RecoveryDeps.of(s), s.presence, held_runs(client, ns, queue))
    try:
        first = watch.poll()
        assert first.dead == ["ghost-1"] and first.republished == []
        # A live worker records its delivery, as kombu does: [message, exchange, routing key];
        # another takes the third off the queue.
        client.hset(f"{ns}{UNACKED}", "tag-1", json.dumps([json.loads(taken[passing]), "", queue]))
        assert _run_of(client.rpop(key)) == late
        assert watch.poll().republished == [lost]
        assert watch.poll().republished == []
        assert publisher.sent == [(lost, 1)] and publisher.redelivered == {(lost, 1): True}
    finally:
        s.presence.stop()
        s.redis.close()
