"""Gates are checked again as they stand now: on resume and at every step (I7)."""

from __future__ import annotations

import time

import pytest

from store.gates import set_agent_tools, set_channel, set_principal
from tests.support.scripts import call, final, mixed, step
from tests.support.stack import script_tools

pytestmark = pytest.mark.kill


def _kill_after_checkpoint(stack, **options) -> str:
    script = {"steps": mixed("g")}
    return stack.kill_at(
        "after_checkpoint:kill",
        lambda: stack.client.start_run(
            agent="support-bot",
            user_input="help",
            model=stack.model(script["steps"]),
            tools=script_tools(script["steps"]),
            **options,
        ),
    )


def _resume(stack) -> None:
    stack.worker("survivor")
    stack.beat()


def test_containment_revoked_between_kill_and_resume(stack) -> None:
    run_id = _kill_after_checkpoint(stack)
    with stack.db() as conn:
        set_agent_tools(conn, "support-bot", ["ticket.read", "issue.comment", "chat.reply"])
    _resume(stack)
    assert stack.wait(run_id).status == "succeeded"
    assert (
        stack.vendor(
            "SELECT count(*) AS n FROM sim.requests WHERE run_id = :r AND vendor = 'incidents'",
            r=run_id,
        )[0].n
        == 0
    )
    refused = stack.told_by_tool(run_id, 2)["incident.create"]
    assert "contained" in refused["refused"]


def test_owner_revoked_between_kill_and_resume_fails_the_run(stack) -> None:
    run_id = _kill_after_checkpoint(stack, owner="mallory")
    with stack.db() as conn:
        set_principal(conn, "mallory", may_run=False, may_act=True, reason="left the company")
    _resume(stack)
    view = stack.wait(run_id)
    assert view.status == "failed"
    assert "owner mallory may no longer run it (left the company)" in view.failure_reason
    assert stack.client.transcript(run_id)[-1][0] == "notice"
    assert stack.vendor_writes(run_id) == []


def test_run_as_authority_revoked_fails_the_run(stack) -> None:
    run_id = _kill_after_checkpoint(stack, run_as="svc-billing")
    with stack.db() as conn:
        set_principal(conn, "svc-billing", may_run=True, may_act=False, reason="key rotated")
    _resume(stack)
    view = stack.wait(run_id)
    assert view.status == "failed" and "svc-billing, may no longer act" in view.failure_reason


def test_disabled_channel_fails_the_run(stack) -> None:
    run_id = _kill_after_checkpoint(stack, channel="teams")
    with stack.db() as conn:
        set_channel(conn, "teams", enabled=False, reason="tenant offboarded")
    _resume(stack)
    view = stack.wait(run_id)
    assert view.status == "failed" and "channel teams is disabled" in view.failure_reason


def test_stop_takes_a_running_run_down_at_once(stack) -> None:
    stack.worker("w1")
    run_id = stack.start(mixed("x", latency_ms=600))
    deadline = time.monotonic() + 30
    while stack.client.get(run_id).step < 1:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert stack.client.stop(run_id=run_id, reason="runaway", by="oncall") == [run_id]
    stopped_at = stack.client.get(run_id)
    assert stopped_at.status == "failed" and "stopped by oncall: runaway" in (
        stopped_at.failure_reason or ""
    )
    time.sleep(2.0)  # the attempt in flight is fenced out: nothing more of it lands
    assert stack.client.get(run_id).step == stopped_at.step < 4


def test_a_stop_issued_while_the_model_answers_stops_the_run_before_its_calls(stack) -> None:
    # The calls of a step go through the gates read with its checkpoint, after the model
    # answered, not the ones read before it was asked: a Stop that lands during a slow model
    # step makes none of that step's calls.
    stack.worker("w1")
    run_id = stack.start(
        [
            step(call("toolu_s_i", "incident.create", title="Slow model"), latency_ms=1500),
            final("Never reached."),
        ]
    )
    deadline = time.monotonic() + 30
    while stack.client.get(run_id).status != "running":
        assert time.monotonic() < deadline
        time.sleep(0.02)
    assert stack.client.stop(run_id=run_id, reason="runaway", by="oncall") == [run_id]
    view = stack.wait(run_id)
    assert view.status == "failed" and "stopped by oncall: runaway" in view.failure_reason
    time.sleep(2.0)  # the model's answer comes after the Stop: its step is never written
    assert stack.client.get(run_id).step == 0
    # At most the step the model was answering (its request abandoned once the lease went),
    # and no other.
    assert stack.asked(run_id) in ({}, {1: 1})
    assert stack.vendor_writes(run_id) == []


def test_stop_of_an_agent_fails_its_queued_runs_at_once(stack) -> None:
    run_id = stack.start(mixed("q"))  # no worker: it stays queued
    assert stack.client.stop(agent="support-bot", reason="incident", by="oncall") == [run_id]
    view = stack.client.get(run_id)
    assert view.status == "failed" and "stopped by oncall" in view.failure_reason
