"""Resumed runs first, on a real broker and real workers: a resumed attempt's message goes to
kombu's first priority bucket and is taken before a backlog of new runs; a lost run whose
surviving slots are all busy gets one at the busy run's next step boundary (it yields)."""

from __future__ import annotations

import base64
import json
import time
from typing import Any

from runtime.entries.client import Client
from runtime.flow.order import NEW, PRIORITY_STEPS, bucket_keys
from runtime.recovery.deaths import republish_reserved
from runtime.recovery.deps import RecoveryDeps
from store.losses import claim_lost_many
from store.runs import claim_delivery
from tests.support.scripts import call, final, step
from tests.support.stack import RecordingPublisher, Stack, script_tools, services_with


def _bucket(stack: Stack, pri: int) -> list[list[Any]]:
    """The run messages (their args: run id, attempt) in one priority bucket of the run queue,
    oldest first, as Redis holds them."""
    queue_key = stack.settings.namespace + stack.settings.queue
    key = bucket_keys(queue_key)[PRIORITY_STEPS.index(pri)]
    raw = stack.services.redis.lrange(key, 0, -1)
    return [json.loads(base64.b64decode(json.loads(m)["body"]))[0] for m in reversed(raw)]


def _lost_run(stack: Stack, steps: list[dict[str, Any]]) -> str:
    """A run started (nothing published), claimed by a worker that died, and claimed as lost
    by the same claim the death watch makes (asking a yield): queued at attempt 2, then its
    message published as the death watch publishes it."""
    quiet = Client(services_with(stack, RecordingPublisher()))
    run_id = quiet.start_run(
        agent="support-bot", model=stack.model(steps), user_input="x", tools=script_tools(steps)
    )
    with stack.engine.begin() as conn:
        assert claim_delivery(conn, run_id, 1, "dead-worker") is not None
        [claim] = claim_lost_many(conn, [(run_id, 1)], loss_limit=3, ask_yields=True)
    assert (claim.attempt, claim.status) == (2, "queued")
    stack.services.publisher.publish(run_id, 2)
    return run_id


def _claimed_at(stack: Stack, run_ids: list[str]) -> dict[str, Any]:
    rows = stack.rows(
        "SELECT CAST(id AS text) AS id, claimed_at, started_at FROM runs "
        "WHERE id = ANY(CAST(:ids AS uuid[]))",
        ids=run_ids,
    )
    return {r.id: (r.claimed_at, r.started_at) for r in rows}


def test_a_resumed_run_is_taken_before_the_backlog(stack) -> None:
    # No worker yet: a backlog of new runs waits in the broker, then a lost run is resumed.
    backlog = [stack.start([final(f"new {i}")]) for i in range(6)]
    resumed = _lost_run(stack, [final("resumed")])
    assert _bucket(stack, 0) == [[resumed, 2]]
    assert _bucket(stack, 6) == [[run_id, 1] for run_id in backlog]
    stack.worker("w1", concurrency=1)
    for run_id in [resumed, *backlog]:
        assert stack.wait(run_id, timeout=60).status == "succeeded"
    times = _claimed_at(stack, [resumed, *backlog])
    first_new = min(started for _, started in (times[r] for r in backlog))
    assert times[resumed][0] < first_new, times


def test_a_message_a_dead_worker_took_goes_back_before_the_backlog(stack) -> None:
    # No worker yet: a backlog of new runs waits, then one more run, whose message a worker
    # took off the queue (kombu's BRPOP), reserved, and died with: it had reached the head of
    # the queue, and the death watch publishes it again there, not behind the backlog.
    backlog = [stack.start([final(f"new {i}")]) for i in range(6)]
    taken = stack.start([final("taken")])
    newest = bucket_keys(stack.settings.namespace + stack.settings.queue)[PRIORITY_STEPS.index(NEW)]
    assert stack.services.redis.lpop(newest) is not None
    assert _bucket(stack, NEW) == [[run_id, 1] for run_id in backlog]
    stack.services.leases.reserve("dead-worker", taken, 1)
    assert republish_reserved(RecoveryDeps.of(stack.services), [(taken, 1)]) == [taken]
    assert _bucket(stack, 0) == [[taken, 1]]
    stack.worker("w1", concurrency=1)
    for run_id in [taken, *backlog]:
        assert stack.wait(run_id, timeout=60).status == "succeeded"
    times = _claimed_at(stack, [taken, *backlog])
    first_new = min(started for _, started in (times[r] for r in backlog))
    assert times[taken][0] < first_new, times
    assert stack.client.get(taken).attempt == 1


def test_a_busy_slot_yields_to_a_lost_run_at_its_next_step(stack) -> None:
    stack.worker("w1", concurrency=1)  # one slot, about to be busy with a long run
    long_steps = [
        *[
            step(call(f"toolu_y_{n}", "ticket.read", ticket=f"T-{n}"), latency_ms=700)
            for n in range(8)
        ],
        final("long done"),
    ]
    busy = stack.start(long_steps)
    deadline = time.monotonic() + 30
    while stack.client.get(busy).step < 1:
        assert time.monotonic() < deadline, "the long run never reached its first checkpoint"
        time.sleep(0.05)
    backlog = [stack.start([final(f"new {i}")]) for i in range(3)]
    lost = _lost_run(stack, [final("lost done")])
    asked = stack.rows(
        "SELECT detail ->> 'asked_to_yield' AS y FROM audit_events "
        "WHERE run_id = :r AND kind = 'agent.run.lost'",
        r=lost,
    )
    assert [a.y for a in asked] == [busy]
    for run_id in [lost, busy, *backlog]:
        assert stack.wait(run_id, timeout=90).status == "succeeded"
    # The long run yielded (handed back, no loss), and the lost run took its slot before any
    # run of the backlog started; the yielded one came back before them too (resumed).
    view = stack.client.get(busy)
    assert (view.attempt, view.lost_count) == (2, 0)
    yielded = stack.rows(
        "SELECT detail FROM audit_events WHERE run_id = :r AND kind = 'agent.run.handed_back'",
        r=busy,
    )
    assert [(y.detail["reason"], y.detail["yielded_to"]) for y in yielded] == [("yielded", lost)]
    times = _claimed_at(stack, [lost, busy, *backlog])
    first_new = min(started for _, started in (times[r] for r in backlog))
    assert times[lost][0] < times[busy][0] < first_new, times
    # Each model step was asked once: the yield repeated nothing (I5), judged from the model
    # server's own records.
    assert stack.asked(busy) == {n: 1 for n in range(1, len(long_steps) + 1)}
    assert stack.asked(lost) == {1: 1}
