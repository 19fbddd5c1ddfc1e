"""A signal sent to a running agent run (`client().signal`) reaches the model as a message at
the run's next step boundary, once: also when the worker that took it is SIGKILLed before the
next step was written."""

from __future__ import annotations

import pytest

from tests.support.drifts import until
from tests.support.scripts import call, final, step

STEPS = [
    step(call("toolu_r1", "ticket.read", ticket="T-1"), latency_ms=1200),
    step(call("toolu_r2", "ticket.read", ticket="T-2"), latency_ms=1200),
    final("Done.", latency_ms=200),
]


def _told(stack, run_id: str, step_no: int) -> list[str]:
    messages = stack.model_request(run_id, step_no)["messages"]
    return [m["content"] for m in messages if str(m.get("content") or "").startswith("Signal ")]


def _asked(stack, run_id: str, step_no: int) -> bool:
    rows = stack.vendor(
        "SELECT 1 FROM sim.requests WHERE vendor = 'model' AND run_id = :r AND call = :s",
        r=run_id,
        s=str(step_no),
    )
    return bool(rows)


def test_a_signal_reaches_the_agent_at_its_next_step_once(stack) -> None:
    stack.worker("w1")
    run_id = stack.start(STEPS)
    until(lambda: _asked(stack, run_id, 1), "the first step asked")
    stack.client.signal(run_id, "note", {"from": "dana", "text": "customer called"}, by="ops")
    view = stack.wait(run_id)
    assert view.status == "succeeded"
    said = 'Signal note: {"from": "dana", "text": "customer called"}'
    assert _told(stack, run_id, 2) == [said]  # at the boundary after step 1
    assert _told(stack, run_id, 3) == [said]  # kept in the conversation, not told again


@pytest.mark.kill
def test_a_signal_taken_by_a_killed_worker_is_told_once(stack) -> None:
    def start() -> str:
        run_id = stack.start(STEPS)
        until(lambda: _asked(stack, run_id, 1), "the first step asked")
        stack.client.signal(run_id, "note", "call back", by="ops")
        return run_id

    # Killed as the model is asked the second step: the signal was taken at the boundary
    # before it, and that step was never written.
    run_id = stack.kill_then_resume("after_model_step:kill:2", start)
    view = stack.wait(run_id)
    assert view.status == "succeeded" and view.lost_count == 1
    assert _told(stack, run_id, 3) == ['Signal note: "call back"']
    taken = stack.rows("SELECT taken_by FROM signals WHERE run_id = :r", r=run_id)
    assert [t.taken_by for t in taken] == ["agent:1"]
