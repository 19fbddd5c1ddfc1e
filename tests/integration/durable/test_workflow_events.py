"""Events published to whichever workflows wait for them (`ctx.wait_event`): each waiting
workflow of the event's name and match takes it once, none takes one published before it first
met its step, a timeout gives None, and a front principal's event reaches only its own runs.
Real workers; the waits hold no worker."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from runtime.core.enqueue import BadRequest
from runtime.ops.signals import publish
from tests.support.py_flows import waiting_on


def _paid(stack, order: str, **params) -> str:
    return stack.client.start_workflow(workflow="acme.paid", params={"order": order, **params})


def test_every_workflow_waiting_for_an_event_takes_it_once(flows) -> None:
    stack = flows
    early = stack.client.publish_event("order.paid", {"early": True}, match="A-1", by="shop")
    stack.worker("w1")
    first, second, other = _paid(stack, "A-1"), _paid(stack, "A-1"), _paid(stack, "B-2")
    for run_id in (first, second, other):
        waiting_on(stack, run_id, "event:")
    # Another order's event wakes none of A-1's waits.
    stack.client.publish_event("order.paid", {"cents": 900}, match="B-2", by="shop")
    assert json.loads(stack.wait(other, timeout=30).answer)["paid"] == {"cents": 900}
    assert stack.client.get(first).status == "waiting"
    sent = stack.client.publish_event("order.paid", {"cents": 1200}, match="A-1", key="pay-1")
    assert sent > early
    # The same key again publishes nothing more.
    assert stack.client.publish_event("order.paid", {"cents": 1}, match="A-1", key="pay-1") == sent
    for run_id in (first, second):
        view = stack.wait(run_id, timeout=30)
        assert view.status == "succeeded", view.failure_reason
        assert json.loads(view.answer) == {"order": "A-1", "paid": {"cents": 1200}}
    assert stack.rows("SELECT count(*) AS n FROM workflow_events")[0].n == 3


def test_a_wait_for_an_event_times_out_as_none(flows) -> None:
    stack = flows
    stack.worker("w1")
    stack.beat()
    view = stack.wait(_paid(stack, "C-3", timeout_s=1), timeout=30)
    assert view.status == "succeeded" and json.loads(view.answer)["paid"] is None


def test_a_front_principals_event_reaches_only_its_own_runs(flows) -> None:
    stack = flows
    stack.worker("w1")
    stack.beat()
    run_id = _paid(stack, "D-4")  # started inside the deployment: no principal
    waiting_on(stack, run_id, "event:")
    publish(stack.services, "order.paid", {"forged": 1}, match="D-4", key=None, by="mallory",
            principal="mallory")  # fmt: skip
    woken = stack.rows(
        "SELECT count(*) AS n FROM audit_events WHERE run_id = :r AND kind = 'agent.run.resumed'",
        r=run_id,
    )[0].n
    assert stack.client.get(run_id).status == "waiting" and woken == 0
    stack.client.publish_event("order.paid", {"real": 1}, match="D-4", by="shop")
    assert json.loads(stack.wait(run_id, timeout=30).answer)["paid"] == {"real": 1}


@pytest.mark.parametrize(
    ("name", "payload", "match", "said"),
    [
        ("order paid", None, None, "a name is"),
        ("order.paid", {"x": object()}, None, "not JSON"),
        ("order.paid", None, "m" * 201, "match must be"),
        ("order.paid", "x" * 70_000, None, "more than"),
    ],
)
def test_bad_events_are_refused_with_nothing_stored(flows, name, payload, match, said) -> None:
    with pytest.raises(BadRequest, match=said):
        flows.client.publish_event(name, payload, match=match, by="shop")
    assert flows.rows("SELECT count(*) AS n FROM workflow_events")[0].n == 0


def test_the_cli_publishes_an_event_and_refuses_a_bad_one(flows) -> None:
    stack = flows
    stack.worker("w1")
    run_id = _paid(stack, "E-5")
    waiting_on(stack, run_id, "event:")

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "liyagent.cli.main", "event", *args],
            env=stack.env, capture_output=True, text=True, timeout=120,
        )  # fmt: skip

    bad = cli("order.paid", "--payload", "{not json", "--by", "shop")
    assert bad.returncode == 2 and "--payload is not JSON" in bad.stderr
    assert "Traceback" not in bad.stderr
    done = cli(
        "order.paid", "--match", "E-5", "--payload", '{"cents": 5}', "--by", "shop", "--json"
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["event"] == "order.paid"
    assert json.loads(stack.wait(run_id, timeout=30).answer)["paid"] == {"cents": 5}
