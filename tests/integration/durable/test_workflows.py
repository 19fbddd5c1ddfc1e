"""Workflows: step keys from the workflow run id, the step id and the steps executed, so a
retry sends the same key and a loop back to the step sends a new one."""

from __future__ import annotations

import json

import pytest

OPEN_AND_LOOP = {
    "start": "open",
    "steps": {
        "open": {"tool": "incident.create", "args": {"title": "Disk full"}, "next": "check"},
        "check": {
            "tool": "ticket.read",
            "args": {"ticket": "T-1"},
            "loop": {"to": "open", "times": 1},
            "next": None,
        },
    },
}


def _incident_posts(stack, run_id):
    return stack.vendor(
        "SELECT idem_key, deduped, attempt FROM sim.requests WHERE run_id = :r "
        "AND vendor = 'incidents' ORDER BY id",
        r=run_id,
    )


def test_loop_back_sends_a_new_key(stack) -> None:
    stack.worker("w1")
    run_id = stack.client.start_workflow(name="disk-runbook", workflow=OPEN_AND_LOOP)
    view = stack.wait(run_id)
    assert view.status == "succeeded"
    assert json.loads(view.answer)["executed"] == 4
    posts = _incident_posts(stack, run_id)
    assert len(posts) == 2 and len({p.idem_key for p in posts}) == 2


@pytest.mark.kill
def test_retry_sends_the_same_key_then_loop_back_a_new_one(stack) -> None:
    stack.worker("victim", fault="after_send:kill")
    run_id = stack.client.start_workflow(name="disk-runbook", workflow=OPEN_AND_LOOP)
    stack.fault_hit("victim")
    stack.worker("survivor")
    stack.beat()
    view = stack.wait(run_id)
    assert view.status == "succeeded" and view.lost_count == 1
    posts = _incident_posts(stack, run_id)
    first, retry, looped = posts
    assert retry.idem_key == first.idem_key and retry.deduped and retry.attempt == 2
    assert looped.idem_key != first.idem_key and not looped.deduped
    incidents = stack.vendor(
        "SELECT count(*) AS n FROM sim.incidents WHERE idem_key IN (:a, :b)",
        a=first.idem_key,
        b=looped.idem_key,
    )[0].n
    assert incidents == 2


def test_bad_workflow_is_refused_and_nothing_is_stored(stack) -> None:
    from runtime.entries.client import BadRequest

    with pytest.raises(BadRequest, match="next"):
        stack.client.start_workflow(
            name="w",
            workflow={"start": "a", "steps": {"a": {"tool": "ticket.read", "next": "nowhere"}}},
        )
    assert stack.rows("SELECT count(*) AS n FROM runs")[0].n == 0
