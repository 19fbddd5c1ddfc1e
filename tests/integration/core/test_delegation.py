"""Delegation to sub-agents: the child is created once by its delegation key, the parent waits
without holding a worker, and a resume asks again by the key (finding the child's answer, or
taking over its lapsed lease once)."""

from __future__ import annotations

import os
import signal
import time

import pytest

from tests.support.scripts import call, final, step

pytestmark = pytest.mark.kill


def _parent(child_latency_ms: int = 0) -> list[dict]:
    child_script = {
        "steps": [
            step(call("toolu_ch1", "ticket.read", ticket="T-5"), latency_ms=child_latency_ms),
            final("Ticket T-5 is a duplicate.", latency_ms=child_latency_ms),
        ]
    }
    return [
        step(
            call(
                "toolu_d1",
                "agent.delegate",
                agent="triage-bot",
                input="Is T-5 a duplicate?",
                script=child_script,
                tools=["ticket.read"],  # the child may use only tools its parent may use
            )
        ),
        final("Closed as duplicate."),
    ]


# The parent delegates and lets its child read tickets.
PARENT_TOOLS = ["agent.delegate", "ticket.read"]


def _children(stack, parent_id):
    return stack.rows(
        "SELECT id, status, lost_count, attempt FROM runs WHERE parent_run_id = :p", p=parent_id
    )


def _told(stack, run_id: str) -> dict:
    return stack.told(run_id, 2)[0]


def test_parent_waits_without_a_worker_and_gets_the_childs_answer(stack) -> None:
    stack.worker("w1", concurrency=1)  # one slot: the parent must give it up for the child
    parent = stack.start(_parent(child_latency_ms=300), tools=PARENT_TOOLS)
    view = stack.wait(parent)
    assert view.status == "succeeded" and view.answer == "Closed as duplicate."
    [child] = _children(stack, parent)
    assert child.status == "succeeded"
    assert _told(stack, parent) == {"answer": "Ticket T-5 is a duplicate.", "child_run": child.id}
    kinds = [
        r.kind
        for r in stack.rows("SELECT kind FROM audit_events WHERE run_id = :r ORDER BY id", r=parent)
    ]
    assert kinds == ["agent.run.waiting", "agent.run.resumed"]


def test_a_child_takes_its_parents_tenant_and_priority(stack) -> None:
    """A sub-agent's run counts in flight for the tenant its parent was started for, at its
    parent's priority (never its owner's default)."""
    stack.worker("w1", concurrency=1)
    steps = _parent()
    parent = stack.client.start_run(
        agent="support-bot",
        model=stack.model(steps),
        user_input="help",
        tools=PARENT_TOOLS,
        tenant="acme",
        priority=3,
    )
    assert stack.wait(parent).status == "succeeded"
    [child] = _children(stack, parent)
    row = stack.rows("SELECT tenant, priority, owner FROM runs WHERE id = :c", c=child.id)[0]
    assert (row.tenant, row.priority, row.owner) == ("acme", 3, "app")


def test_parent_lost_after_creating_the_child_asks_again_by_key(stack) -> None:
    stack.worker("victim", fault="after_request:kill")
    parent = stack.start(_parent(), tools=PARENT_TOOLS)
    stack.fault_hit("victim")
    stack.worker("survivor")
    stack.beat()
    assert stack.wait(parent).status == "succeeded"
    [child] = _children(stack, parent)  # found again by its key, never created twice
    assert child.status == "succeeded"
    assert _told(stack, parent)["answer"] == "Ticket T-5 is a duplicate."


def test_parent_and_child_lost_together_child_is_claimed_once(stack) -> None:
    victim = stack.worker("victim", fault="after_request:stop", concurrency=2)
    parent = stack.start(_parent(child_latency_ms=1500), tools=PARENT_TOOLS)
    stack.fault_hit("victim")  # the parent's process is stopped just after filing the child
    deadline = time.monotonic() + 30
    while not any(c.status == "running" for c in _children(stack, parent)):
        assert time.monotonic() < deadline, "the child never started on the victim"
        time.sleep(0.05)
    victim.kill()  # the whole worker dies: parent and child are both lost
    stack.worker("survivor", concurrency=2)
    stack.beat()
    assert stack.wait(parent, timeout=90).status == "succeeded"
    [child] = _children(stack, parent)
    assert child.status == "succeeded" and child.lost_count == 1 and child.attempt == 2
    losses = stack.rows(
        "SELECT count(*) AS n FROM audit_events WHERE run_id = :c AND kind = 'agent.run.lost'",
        c=child.id,
    )[0].n
    assert losses == 1  # the sweeper and the parent raced for it: one claim
    assert _told(stack, parent)["answer"] == "Ticket T-5 is a duplicate."
    reads = stack.vendor("SELECT count(*) AS n FROM sim.requests WHERE run_id = :c", c=child.id)
    assert reads[0].n >= 1


def test_resumed_parent_takes_over_its_childs_lapsed_lease_itself(stack) -> None:
    """The child's worker stalls past its lease while the parent's process dies; with no sweeper
    (no worker sweeps) and the child's connections still open (the death watch leaves a stalled
    process alone), only the resumed parent, asking again by its delegation key, can claim the
    child: it does, once, and the child's loss audit names that path."""
    parent_worker = stack.worker(
        "parent", fault="after_request:stop", concurrency=1, ops=False, sweeps=False
    )
    parent = stack.start(_parent(), tools=PARENT_TOOLS)
    stopped = int(stack.fault_hit("parent").split()[1])  # the pool process that filed the child
    stack.worker("child", fault="after_checkpoint:stop", concurrency=1, ops=False, sweeps=False)
    stack.fault_hit("child")  # the child is checkpointed, then its process stalls
    [child] = _children(stack, parent)
    deadline = time.monotonic() + 30
    while stack.services.leases.holder(child.id) is not None:  # its lease lapses, unrenewed
        assert time.monotonic() < deadline, "the stalled child's lease never lapsed"
        time.sleep(0.05)
    os.kill(stopped, signal.SIGKILL)  # the parent's pool process dies; its main process sees it
    assert stack.wait(parent, timeout=60).status == "succeeded"
    [child] = _children(stack, parent)
    assert child.status == "succeeded" and child.lost_count == 1 and child.attempt == 2
    seen = stack.rows(
        "SELECT detail->>'seen' AS seen FROM audit_events WHERE run_id = :c "
        "AND kind = 'agent.run.lost'",
        c=child.id,
    )
    assert [s.seen for s in seen] == ["parent_asked_again"]  # claimed by the parent, once
    assert _told(stack, parent)["answer"] == "Ticket T-5 is a duplicate."
    assert parent_worker.popen.poll() is None  # the parent's worker lived on throughout


def test_a_child_may_not_use_tools_its_parent_may_not(stack) -> None:
    stack.worker("w1")
    wider = [
        step(
            call(
                "toolu_dw",
                "agent.delegate",
                agent="pager-bot",
                input="Open an incident.",
                script={"steps": [final("Opened.")]},
                tools=["incident.create"],
            )
        ),
        final("Could not delegate."),
    ]
    parent = stack.start(wider)  # it may use agent.delegate only
    assert stack.wait(parent).status == "succeeded"
    told = _told(stack, parent)
    assert "may use only tools its parent run may use; not incident.create" in told["error"]
    assert _children(stack, parent) == []


def test_a_models_delegation_cannot_start_a_workflow_or_pick_a_model(stack) -> None:
    """What a model writes in a delegation's arguments never names a workflow to start or a
    model profile to use: its child is an agent on its parent's model."""
    stack.worker("w1")
    child_script = {"steps": [final("Done.")]}
    parent = stack.start(
        [
            step(
                call(
                    "toolu_d9",
                    "agent.delegate",
                    agent="triage-bot",
                    input="Go",
                    script=child_script,
                    workflow="acme.anything",
                    model={"provider": "openai", "model": "gpt-4o"},
                )
            ),
            final("ok"),
        ],
        tools=PARENT_TOOLS,
    )
    assert stack.wait(parent).status == "succeeded"
    [child] = stack.rows(
        "SELECT kind, definition IS NOT NULL AS d FROM runs WHERE parent_run_id = :p", p=parent
    )
    assert child.kind == "agent"
    assert stack.definition(_children(stack, parent)[0].id).model["provider"] == "scripted"
