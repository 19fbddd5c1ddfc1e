"""A workflow declared to catch a Stop (`@workflow(catches_stop=True)`) is handed, on a Stop,
to a new attempt that raises `WorkflowStopped` at the step it was at, so it undoes what it did;
its stopped attempt writes nothing more. Real workers, judged by the vendor's own records."""

from __future__ import annotations

import json

import pytest

from tests.support.drifts import until
from tests.support.py_flows import incidents, waiting_on


def _ended(stack, run_id: str):
    view = stack.wait(run_id, timeout=60)
    assert view.status == "failed" and view.failure_reason
    return view


def test_a_stop_while_it_waits_raises_at_its_wait_and_it_cancels(flows) -> None:
    stack = flows
    stack.worker("w1")
    run_id = stack.client.start_workflow(workflow="acme.booking", params={})
    waiting_on(stack, run_id, "signal:confirm:")
    # Not failed now: handed to the attempt that compensates.
    assert stack.client.stop(run_id=run_id, reason="customer left", by="ops") == []
    view = _ended(stack, run_id)
    assert view.failure_reason.startswith("stopped by ops: customer left; its workflow compensated")
    said = json.loads(view.failure_reason.split("it returned ", 1)[1].rstrip(")"))
    assert said == {"cancelled": "book room", "at": "confirm#1", "in_flight": False}
    assert incidents(stack, run_id) == ["book room", "pay", "cancel room"]
    codes = stack.rows(
        "SELECT detail->>'code' AS code FROM audit_events WHERE run_id = :r "
        "AND kind = 'agent.run.failed'",
        r=run_id,
    )
    assert [c.code for c in codes] == ["stopped"]
    # A signal sent after the Stop is refused (the run ended), and nothing more is written.
    assert incidents(stack, run_id) == ["book room", "pay", "cancel room"]


@pytest.mark.parametrize("push", ["true", "false"])
def test_a_stop_cuts_the_step_in_flight_and_raises_there(flows, push: str) -> None:
    """With the push, the cut is at once; without it (a worker that misses the word), the fence
    in its lease's place fails its next renewal: either way the stopped attempt stops before the
    compensating one starts, and the compensation runs."""
    stack = flows
    stack.worker("w1", env={"LIYAGENT_STOP_PUSH": push})
    run_id = stack.client.start_workflow(workflow="acme.booking", params={"pay_ms": 20_000})
    pays = (
        "SELECT count(*) AS n FROM sim.requests WHERE run_id = :r AND vendor = 'incidents' "
        "AND body->>'title' = 'pay'"
    )

    until(lambda: stack.vendor(pays, r=run_id)[0].n == 1, "the payment in flight")
    assert stack.client.stop(run_id=run_id, reason="fraud", by="ops") == []
    # The payment's answer would take 20 s; the run has compensated long before.
    view = _ended(stack, run_id)
    said = json.loads(view.failure_reason.split("it returned ", 1)[1].rstrip(")"))
    assert said == {"cancelled": "book room", "at": "pay#1", "in_flight": True}
    assert stack.vendor(pays, r=run_id)[0].n == 1  # never sent again
    titles = [
        r.body["title"]
        for r in stack.vendor(
            "SELECT body FROM sim.requests WHERE run_id = :r AND vendor = 'incidents' "
            "AND method = 'POST' ORDER BY id",
            r=run_id,
        )
    ]
    assert titles == ["book room", "pay", "cancel room"]


def test_a_second_stop_ends_a_compensating_run_at_once(flows) -> None:
    stack = flows
    run_id = stack.client.start_workflow(workflow="acme.booking", params={})  # no worker yet
    assert stack.client.stop(run_id=run_id, reason="first", by="ops") == []
    assert stack.client.get(run_id).status == "queued"  # queued to compensate
    assert stack.client.stop(run_id=run_id, reason="second", by="ops") == [run_id]
    view = stack.client.get(run_id)
    assert view.status == "failed" and view.failure_reason == "stopped by ops: second"
    stack.worker("w1")  # its message is stale now: nothing runs, nothing is written
    view = stack.wait(run_id, timeout=10)
    assert view.failure_reason == "stopped by ops: second" and incidents(stack, run_id) == []


@pytest.mark.kill
def test_a_compensation_killed_mid_step_resumes_and_undoes_once(flows) -> None:
    """SIGKILLed right after its compensation step's record (the booking, the payment and the
    Stop's record were the ones before), the run is resumed by a survivor: the Stop is raised at
    the same step again and the cancellation is made once."""
    stack = flows
    victim = stack.worker("victim", fault="after_checkpoint:kill:3")
    run_id = stack.client.start_workflow(workflow="acme.booking", params={})
    waiting_on(stack, run_id, "signal:confirm:")
    assert stack.client.stop(run_id=run_id, reason="customer left", by="ops") == []
    stack.fault_hit("victim")
    victim.popen.wait(timeout=10)
    stack.worker("survivor")
    stack.beat()
    view = _ended(stack, run_id)
    said = json.loads(view.failure_reason.split("it returned ", 1)[1].rstrip(")"))
    assert said == {"cancelled": "book room", "at": "confirm#1", "in_flight": False}
    assert view.lost_count == 1
    assert incidents(stack, run_id) == ["book room", "pay", "cancel room"]
