"""Approval-held writes: one request per step key however often the call is routed; a run
that may wait suspends without holding a worker; an approved call is sent with its approval
id as its key, however often it is sent."""

from __future__ import annotations

import pytest

from tests.support.scripts import call, final, step

pytestmark = pytest.mark.kill

PAGE = [
    step(call("toolu_p1", "incident.page", title="Checkout down", severity="sev1")),
    final("Paged."),
]


def _approvals(stack, run_id):
    return stack.client.approvals(run_id)


def _incident_posts(stack, run_id):
    return stack.vendor(
        "SELECT idem_key, deduped, attempt FROM sim.requests WHERE run_id = :r "
        "AND vendor = 'incidents' AND method = 'POST' ORDER BY id",
        r=run_id,
    )


def _wait_status(stack, run_id, status):
    return stack.client.wait(run_id, timeout_s=60, until=frozenset({status}))


def test_request_routed_again_after_a_crash_coalesces(stack) -> None:
    stack.worker("victim", fault="after_request:kill")
    run_id = stack.start(PAGE)
    stack.fault_hit("victim")
    stack.worker("survivor")
    stack.beat()
    view = _wait_status(stack, run_id, "waiting")
    [request] = _approvals(stack, run_id)
    assert view.waiting_on == f"approval:{request.id}" and request.status == "pending"
    assert view.lost_count == 1
    stack.client.decide(request.id, approve=True, by="alice")
    assert stack.wait(run_id).status == "succeeded"
    assert len(_approvals(stack, run_id)) == 1
    assert [(p.idem_key, p.deduped) for p in _incident_posts(stack, run_id)] == [
        (request.id, False)
    ]


def test_decision_made_while_the_run_was_lost_is_read_not_filed_again(stack) -> None:
    stack.worker("victim", fault="after_request:kill")
    run_id = stack.start(PAGE)
    stack.fault_hit("victim")
    stack.procs[-1].popen.wait(timeout=10)
    [request] = _approvals(stack, run_id)
    assert stack.client.get(run_id).status == "running"  # lost, not yet noticed
    stack.client.decide(request.id, approve=True, by="bob")
    stack.worker("survivor")
    stack.beat()
    view = stack.wait(run_id)
    assert view.status == "succeeded" and view.lost_count == 1
    assert [a.status for a in _approvals(stack, run_id)] == ["approved"]
    assert [(p.idem_key, p.attempt) for p in _incident_posts(stack, run_id)] == [(request.id, 2)]


def test_approved_call_in_doubt_is_sent_again_with_its_approval_id(stack) -> None:
    stack.worker("victim", fault="after_send:kill")
    run_id = stack.start(PAGE)
    _wait_status(stack, run_id, "waiting")
    [request] = _approvals(stack, run_id)
    stack.client.decide(request.id, approve=True, by="carol")
    stack.fault_hit("victim")
    stack.worker("survivor")
    stack.beat()
    assert stack.wait(run_id).status == "succeeded"
    posts = _incident_posts(stack, run_id)
    assert [(p.idem_key, p.deduped) for p in posts] == [(request.id, False), (request.id, True)]
    assert (
        stack.vendor("SELECT count(*) AS n FROM sim.incidents WHERE idem_key = :k", k=request.id)[
            0
        ].n
        == 1
    )


def test_denied_call_is_not_made_and_the_model_is_told(stack) -> None:
    stack.worker("w1")
    run_id = stack.start(PAGE)
    _wait_status(stack, run_id, "waiting")
    [request] = _approvals(stack, run_id)
    stack.client.decide(request.id, approve=False, by="dave", reason="not an outage")
    assert stack.wait(run_id).status == "succeeded"
    assert _incident_posts(stack, run_id) == []
    outcome = stack.told(run_id, 2)[0]
    assert outcome["denied"] is True and outcome["reason"] == "not an outage"


def test_a_run_that_cannot_wait_is_told_the_call_is_held(stack) -> None:
    stack.worker("w1")
    run_id = stack.client.start_run(
        agent="bot",
        user_input="page them",
        entry_kind="webhook",
        model=stack.model(PAGE),
        tools=["incident.page"],
    )
    assert stack.wait(run_id).status == "succeeded"
    [request] = _approvals(stack, run_id)
    assert request.status == "pending"
    assert stack.told(run_id, 2)[0]["held_for_approval"] == request.id
    assert _incident_posts(stack, run_id) == []


def test_deciding_twice_changes_nothing(stack) -> None:
    stack.worker("w1")
    run_id = stack.start(PAGE)
    _wait_status(stack, run_id, "waiting")
    [request] = _approvals(stack, run_id)
    stack.client.decide(request.id, approve=True, by="erin")
    from runtime.entries.client import BadRequest

    with pytest.raises(BadRequest, match="already approved"):
        stack.client.decide(request.id, approve=False, by="frank")
    assert stack.wait(run_id).status == "succeeded"
    assert len(_incident_posts(stack, run_id)) == 1
