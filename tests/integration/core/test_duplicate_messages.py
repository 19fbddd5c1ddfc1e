"""A message delivered more than once, or for an old attempt, changes nothing (I4)."""

from __future__ import annotations

import time

import pytest

from store.losses import claim_lost
from store.runs import claim_delivery
from tests.support.scripts import mixed


@pytest.mark.kill
def test_duplicated_message_executes_once(stack) -> None:
    run_id = stack.start(mixed("d", latency_ms=200))
    for _ in range(3):  # the same message, published again and again
        stack.services.publisher.publish(run_id, 1)
    stack.worker("w1", concurrency=2)
    stack.worker("w2", concurrency=2)
    view = stack.wait(run_id, timeout=60)
    assert view.status == "succeeded" and view.attempt == 1 and view.lost_count == 0
    assert stack.posts_by_vendor(run_id) == {"incidents": 1, "issues": 1, "chat": 1}
    assert stack.asked(run_id) == {1: 1, 2: 1, 3: 1, 4: 1}
    assert sum(1 for role, _ in stack.client.transcript(run_id) if role == "assistant") == 1
    _no_reservation_left(stack)


def _no_reservation_left(stack) -> None:
    """Every message the workers received was let go: taken as a lease, or dropped by the main
    process (a delivery that found the lease taken); none would be republished if they died."""
    client, ns = stack.services.leases.client, stack.settings.namespace
    deadline = time.monotonic() + 30
    while left := {k: client.smembers(k) for k in client.scan_iter(f"{ns}holder:*:reserved")}:
        assert time.monotonic() < deadline, left
        time.sleep(0.05)


@pytest.mark.kill
def test_message_for_an_old_attempt_is_dropped(stack) -> None:
    stack.worker("w1")
    run_id = stack.start(mixed("o"))
    assert stack.wait(run_id, timeout=60).status == "succeeded"
    before = stack.vendor("SELECT count(*) AS n FROM sim.requests WHERE run_id = :r", r=run_id)
    for attempt in (1, 2, 0):
        stack.services.publisher.publish(run_id, attempt)
    deadline = time.monotonic() + 30
    w1 = stack.procs[0]
    # Each is dropped: stale by its claim, or while another copy briefly holds the free lease.
    while w1.output().count('"message.stale"') + w1.output().count('"message.lease_taken"') < 3:
        assert time.monotonic() < deadline, w1.output()[-2000:]
        time.sleep(0.05)
    after = stack.vendor("SELECT count(*) AS n FROM sim.requests WHERE run_id = :r", r=run_id)
    assert after == before
    assert stack.client.get(run_id).attempt == 1
    _no_reservation_left(stack)


@pytest.mark.kill
def test_the_current_message_is_not_dropped_while_a_stale_delivery_holds_the_lease(stack) -> None:
    # A pool child dies: its parent claims the run (attempt 2) and publishes it, while Celery
    # requeues the dead child's attempt-1 message. If that stale copy takes the free lease for
    # the moment its fence takes, the attempt-2 message that arrives then must not be dropped.
    run_id = stack.start(mixed("s"))  # its attempt-1 message waits in the queue
    with stack.db() as conn:
        assert claim_delivery(conn, run_id, 1, "dead-child") is not None
        assert claim_lost(conn, run_id, 1, loss_limit=2) is not None  # now attempt 2, queued
    leases = stack.services.leases
    # Held far longer than a worker takes to start on a loaded machine, so the race is met.
    leases.client.set(leases.key(run_id), f"{run_id}:1:stale-copy", px=15_000)
    stack.services.publisher.publish(run_id, 2)
    w1 = stack.worker("w1", concurrency=1)
    view = stack.wait(run_id, timeout=60)
    assert view.status == "succeeded" and view.attempt == 2
    assert '"message.requeued"' in w1.output()
    assert stack.posts_by_vendor(run_id) == {"incidents": 1, "issues": 1, "chat": 1}
