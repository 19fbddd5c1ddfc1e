"""Workflows in ordinary Python (`@workflow`) on real workers: steps recorded by name and
occurrence, settled by their kinds after a SIGKILL, approvals, durable timers and signals that
hold no worker, child runs; judged from the vendor simulator's own records."""

from __future__ import annotations

import json
import time
from collections import Counter
from pathlib import Path

import pytest

from runtime.entries.client import BadRequest
from tests.support.drifts import until
from tests.support.py_flows import EDITED, incidents, install_flows, waiting_on
from tests.support.scripts import final


def test_an_order_workflow_waits_for_a_person_a_timer_and_a_signal(flows) -> None:
    stack = flows
    stack.worker("w1")
    stack.beat()
    run_id = stack.client.start_workflow(workflow="acme.order", params={"ticket": "T-7"})
    waiting_on(stack, run_id, "approval:")
    (pending,) = stack.client.approvals(run_id)
    stack.client.decide(pending.id, approve=True, by="dana")
    waiting_on(stack, run_id, "signal:go:")
    signal_id = stack.client.signal(run_id, "go", {"ok": 1}, key="go-once", by="ops")
    # The same key again sends nothing more (exactly once).
    assert stack.client.signal(run_id, "go", {"ok": 2}, key="go-once", by="ops") == signal_id
    view = stack.wait(run_id, timeout=60)
    assert view.status == "succeeded", view.failure_reason
    answer = json.loads(view.answer)
    assert answer["signal"] == {"ok": 1}
    # Its key sent once more after the run ended: the signal it sent, not a refusal.
    assert stack.client.signal(run_id, "go", {"ok": 3}, key="go-once", by="ops") == signal_id
    assert incidents(stack, run_id) == ["about Ticket T-7"]
    # No worker held it while it waited: each wait ended its attempt.
    waits = stack.rows(
        "SELECT count(*) AS n FROM audit_events WHERE run_id = :r AND kind = 'agent.run.waiting'",
        r=run_id,
    )[0].n
    assert waits >= 3


def test_a_denied_approval_is_the_workflows_to_handle(flows) -> None:
    stack = flows
    stack.worker("w1")
    run_id = stack.client.start_workflow(workflow="acme.order", params={})
    waiting_on(stack, run_id, "approval:")
    (pending,) = stack.client.approvals(run_id)
    stack.client.decide(pending.id, approve=False, by="dana", reason="not ours")
    view = stack.wait(run_id)
    assert view.status == "succeeded" and json.loads(view.answer) == {"denied": "not ours"}


def test_two_signals_of_one_name_are_taken_in_order_each_once(flows) -> None:
    stack = flows
    stack.worker("w1")
    stack.beat()
    run_id = stack.client.start_workflow(workflow="acme.waits", params={})
    waiting_on(stack, run_id, "signal:item:never")
    stack.client.signal(run_id, "item", "first", by="ops")
    stack.client.signal(run_id, "item", "second", by="ops")
    view = stack.wait(run_id)
    assert view.status == "succeeded" and json.loads(view.answer) == ["first", "second"]
    taken = stack.rows("SELECT taken_by FROM signals WHERE run_id = :r ORDER BY id", r=run_id)
    assert [t.taken_by for t in taken] == ["item#1", "item#2"]


def test_a_signal_to_a_missing_or_ended_run_is_refused(flows) -> None:
    stack = flows
    with pytest.raises(BadRequest, match="does not exist"):
        stack.client.signal("7f1c1f3e-8f8e-4c1e-9b1e-1f2e3d4c5b6a", "go", by="ops")
    stack.worker("w1")
    run_id = stack.client.start_workflow(workflow="acme.child", params={})
    assert stack.wait(run_id).status == "succeeded"
    with pytest.raises(BadRequest, match="has ended"):
        stack.client.signal(run_id, "go", {"x": 1}, by="ops")
    with pytest.raises(BadRequest, match="a name is"):
        stack.client.signal(run_id, "no spaces", by="ops")
    assert stack.rows("SELECT count(*) AS n FROM signals")[0].n == 0


def test_a_gather_under_one_name_numbers_its_steps_in_the_order_it_starts_them(flows) -> None:
    stack = flows
    stack.worker("w1")
    view = stack.wait(stack.client.start_workflow(workflow="acme.same_names", params={"n": 12}))
    assert view.status == "succeeded", view.failure_reason
    assert json.loads(view.answer) == list(range(12))


@pytest.mark.kill
def test_branches_whose_steps_end_in_any_order_keep_their_identities_across_a_kill(
    flows,
) -> None:
    stack = flows

    def start() -> str:
        return stack.client.start_workflow(workflow="acme.branches", params={"n": 8})

    # Killed at the eleventh record: some branches have saved, others are still getting.
    run_id = stack.kill_then_resume("after_checkpoint:kill:11", start)
    view = stack.wait(run_id, timeout=90)
    assert view.status == "succeeded" and view.lost_count == 1, view.failure_reason
    assert json.loads(view.answer) == [i * 10 for i in range(8)]


def test_a_declared_agent_step_without_a_model_is_refused_by_name(flows) -> None:
    stack = flows
    stack.worker("w1")
    view = stack.wait(stack.client.start_workflow(workflow="acme.parent", params={"model": None}))
    assert view.status == "failed"
    assert "agent 'helper' is not declared here" in (view.failure_reason or "")


def test_a_cron_trigger_starts_a_workflow_once_per_slot(flows, tmp_path: Path) -> None:
    from datetime import UTC, datetime

    from runtime.entries.cron import fire_cron

    stack = flows
    catalog = tmp_path / "agents.json"
    catalog.write_text(
        json.dumps(
            {
                "agents": {},
                "cron": [
                    {"name": "leaf", "workflow": "acme.child", "params": {"parent": "cron"},
                     "every_s": 3600}
                ],
            }
        )
    )  # fmt: skip
    stack.reconfigure(agents_file=str(catalog))
    now = datetime.now(tz=UTC)
    first, created = fire_cron(stack.services, "leaf", now)
    again, created_again = fire_cron(stack.services, "leaf", now)  # a second beat
    assert first == again and created and not created_again
    stack.worker("w1")
    view = stack.wait(first)
    assert view.status == "succeeded" and json.loads(view.answer)["child_of"] == "cron"
    [record] = stack.rows("SELECT run_id, status FROM cron_runs")
    assert (record.run_id, record.status) == (first, "succeeded")


def test_bad_starts_store_nothing(flows) -> None:
    stack = flows
    with pytest.raises(BadRequest, match=r"unknown workflow 'acme\.nope'"):
        stack.client.start_workflow(workflow="acme.nope", params={})
    with pytest.raises(BadRequest, match=r"bad parameters \(n: "):
        stack.client.start_workflow(workflow="acme.fanout", params={"n": "many"})
    with pytest.raises(BadRequest, match="typo: Extra inputs are not permitted"):
        stack.client.start_workflow(workflow="acme.fanout", params={"typo": 1})
    assert stack.rows("SELECT count(*) AS n FROM runs")[0].n == 0


def test_bad_steps_are_named_and_nothing_of_them_is_recorded(flows) -> None:
    stack = flows
    stack.worker("w1")
    reused = stack.client.start_workflow(workflow="acme.two_kinds", params={})
    view = stack.wait(reused)
    assert view.status == "failed"
    assert "step name 'x' is used for a read step and now for a write step" in (
        view.failure_reason or ""
    )
    odd = stack.wait(stack.client.start_workflow(workflow="acme.unrecordable", params={}))
    answer = json.loads(odd.answer)
    assert answer["refused"] == "StepError" and "step bad#1" in answer["said"]


def test_a_step_that_fails_is_caught_to_compensate(flows) -> None:
    stack = flows
    stack.worker("w1")
    view = stack.wait(stack.client.start_workflow(workflow="acme.compensate", params={}))
    answer = json.loads(view.answer)
    assert answer["compensated"] == "undo charge" and "card declined" in answer["why"]


def test_child_agent_and_child_workflow_steps(flows) -> None:
    stack = flows
    stack.worker("w1")
    model = stack.model([final("Summary: all good.")])
    run_id = stack.client.start_workflow(workflow="acme.parent", params={"model": model})
    view = stack.wait(run_id, timeout=60)
    assert view.status == "succeeded", view.failure_reason
    answer = json.loads(view.answer)
    assert answer["agent"] == "Summary: all good."
    assert answer["sub"] == {"child_of": run_id, "made": "leaf"}
    children = stack.rows("SELECT kind FROM runs WHERE parent_run_id = :r ORDER BY kind", r=run_id)
    assert [c.kind for c in children] == ["agent", "workflow"]


def test_a_stop_of_the_root_ends_the_whole_tree_at_once_and_nothing_is_written_after(
    flows,
) -> None:
    stack = flows
    stack.worker("w1", concurrency=4)
    root = stack.client.start_workflow(workflow="acme.nest", params={"depth": 3})
    tree = "SELECT id, status FROM runs WHERE agent = 'acme.nest' ORDER BY created_at"
    until(lambda: len(stack.rows(tree)) == 4, "the tree of four runs started")
    leaf = stack.rows(tree)[-1].id
    until(lambda: len(incidents(stack, leaf)) >= 2, "the leaf writing")
    stopped = stack.client.stop(run_id=root, reason="wrong customer", by="ops")
    at = stack.vendor("SELECT clock_timestamp() AS now_at")[0].now_at
    assert sorted(stopped) == sorted(r.id for r in stack.rows(tree))  # all four, at once
    assert {r.status for r in stack.rows(tree)} == {"failed"}
    assert stack.rows("SELECT count(*) AS n FROM stops")[0].n == 4
    time.sleep(4)  # a heartbeat and more: the leaf's attempt has lost its lease by now
    later = stack.vendor(
        "SELECT count(*) AS n FROM sim.requests WHERE run_id = :r AND created_at > :t",
        r=leaf,
        t=at,
    )[0].n
    assert later <= 1  # at most the request already in flight when the Stop came
    assert {r.status for r in stack.rows(tree)} == {"failed"}


@pytest.mark.kill
def test_a_gather_killed_mid_flight_never_pairs_a_result_with_another_step(flows) -> None:
    stack = flows

    def start() -> str:
        return stack.client.start_workflow(workflow="acme.fanout", params={"n": 20})

    # SIGKILLed at the 12th step's record: earlier steps are in flight at the vendor.
    run_id = stack.kill_then_resume("after_checkpoint:kill:12", start)
    view = stack.wait(run_id, timeout=90)
    assert view.status == "succeeded" and view.lost_count == 1
    assert json.loads(view.answer) == [f"item-{i}" for i in range(20)]
    made = Counter(incidents(stack, run_id))
    assert made == Counter({f"item-{i}": 1 for i in range(20)})  # each once, none twice


@pytest.mark.kill
def test_a_write_in_doubt_is_read_back_not_sent_again(flows) -> None:
    stack = flows
    stack.worker("w1", fault="after_send:kill:3")
    stack.beat()
    run_id = stack.client.start_workflow(workflow="acme.order", params={})
    waiting_on(stack, run_id, "approval:")
    (pending,) = stack.client.approvals(run_id)
    stack.client.decide(pending.id, approve=True, by="dana")
    waiting_on(stack, run_id, "signal:go:")
    stack.client.signal(run_id, "go", "now", by="ops")
    stack.fault_hit("w1")  # killed right after the comment was sent, before it was recorded
    stack.worker("survivor")
    view = stack.wait(run_id, timeout=60)
    assert view.status == "succeeded", view.failure_reason
    comments = stack.vendor(
        "SELECT count(*) AS n FROM sim.requests WHERE run_id = :r AND path LIKE '/issues/%'",
        r=run_id,
    )[0].n
    assert comments == 1
    assert incidents(stack, run_id) == ["about Ticket T-1"]


def test_an_edited_workflow_resumed_on_new_code_never_mispairs(
    flows, tmp_path: Path, monkeypatch
) -> None:
    stack = flows
    old = stack.worker("old")
    stack.beat()
    run_id = stack.client.start_workflow(workflow="acme.order", params={})
    waiting_on(stack, run_id, "approval:")
    old.kill()
    install_flows(stack, tmp_path / "acme2", monkeypatch, source=EDITED)
    stack.worker("new")
    (pending,) = stack.client.approvals(run_id)
    stack.client.decide(pending.id, approve=True, by="dana")
    waiting_on(stack, run_id, "signal:go:")
    stack.client.signal(run_id, "go", "on new code", by="ops")
    view = stack.wait(run_id, timeout=60)
    assert view.status == "succeeded", view.failure_reason
    # The ticket read and the incident are the ones recorded before the deploy: the inserted
    # step ran once, new, and took no other step's result.
    assert incidents(stack, run_id) == ["about Ticket T-1"]
    assert json.loads(view.answer)["signal"] == "on new code"
