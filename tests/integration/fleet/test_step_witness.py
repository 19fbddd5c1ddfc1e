"""A rollback of a run's newest steps is seen: Redis witnesses the highest step each run has
written (renewed with its lease, exact when the run waits or is handed back), so a step record
deleted from Postgres with `runs.step` set back, which leaves a chain that verifies, fails the
run instead of asking the model for that step again (I5, I6). Judged from Postgres and the
model server's own records."""

from __future__ import annotations

import pytest

from tests.support.scripts import call, final, step

READ_THEN_PAGE = [
    step(call("toolu_wit_r", "ticket.read", ticket="T-1")),
    step(call("toolu_wit_p", "incident.page", title="Checkout down")),
    final("Paged."),
]


def _roll_back(stack, run_id: str, to: int) -> None:
    """What the probe did: drop the newest step records and set the run's step back."""
    stack.rows("DELETE FROM run_steps WHERE run_id = :r AND step > :s RETURNING 1", r=run_id, s=to)
    stack.rows("UPDATE runs SET step = :s WHERE id = :r RETURNING 1", s=to, r=run_id)


def _failed_rolled_back(stack, run_id: str) -> None:
    view = stack.wait(run_id, timeout=60)
    assert view.status == "failed", view
    assert "its newest steps were removed" in (view.failure_reason or "")
    codes = stack.rows(
        "SELECT detail ->> 'code' AS code FROM audit_events WHERE run_id = :r "
        "AND kind = 'agent.run.failed'",
        r=run_id,
    )
    assert [c.code for c in codes] == ["steps_rolled_back"]


def test_a_waiting_runs_newest_step_removed_is_seen_and_never_asked_again(stack) -> None:
    stack.worker("w1")
    run_id = stack.start(READ_THEN_PAGE)
    view = stack.client.wait(run_id, timeout_s=60, until=frozenset({"waiting"}))
    assert view.step == 2
    _roll_back(stack, run_id, 1)
    [request] = stack.client.approvals(run_id)
    stack.client.decide(request.id, approve=True, by="alice")
    _failed_rolled_back(stack, run_id)
    # Step 2 was asked once, by the attempt that wrote it; never again.
    assert stack.asked(run_id) == {1: 1, 2: 1}
    assert stack.vendor_writes(run_id) == []  # the page was never sent


@pytest.mark.kill
def test_a_lost_runs_newest_step_removed_is_seen(stack) -> None:
    """Witnessed by the heartbeat's renewal, no round trip of its own: a step written more
    than a heartbeat before the worker died is known to Redis."""
    slow = [
        step(call("toolu_wit_a", "ticket.read", ticket="T-1")),
        step(call("toolu_wit_b", "ticket.read", ticket="T-2"), latency_ms=2500),
        final("Read both."),
    ]
    run_id = stack.kill_at("after_model_step:kill:2", lambda: stack.start(slow))
    assert stack.rows("SELECT step FROM runs WHERE id = :r", r=run_id)[0].step == 1
    _roll_back(stack, run_id, 0)
    stack.worker("survivor")
    stack.beat()
    _failed_rolled_back(stack, run_id)
    assert stack.asked(run_id) == {1: 1, 2: 1}  # step 1 never asked again


def test_an_untouched_run_keeps_no_witness_once_it_ends(stack) -> None:
    """The witness is bounded: it goes when its run ends."""
    stack.worker("w1")
    run_id = stack.start([*READ_THEN_PAGE[:1], final("Read.")])
    assert stack.wait(run_id).status == "succeeded"
    assert stack.services.redis.exists(stack.services.leases.witness_key(run_id)) == 0
