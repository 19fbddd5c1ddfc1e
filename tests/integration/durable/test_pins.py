"""A run keeps the definition it started with across a deploy (issue 35, items 1 and 2), on
real workers running different code (their own LIYAGENT_TOOLS modules): a pinned run that a
worker's code does not serve waits for one that does (audited, told in its events), and is
served by it; with no such worker it fails once it has waited its time, with the reason; a run
that follows the latest definition is re-pinned and goes on. Judged from Postgres."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from runtime.ops.deploy_status import deploy_status
from tests.support.desk_code import DESK_V1, DESK_V2
from tests.support.drifts import drift_audits, until
from tests.support.scripts import call, final, step
from tests.support.user_modules import install, write_module

SCRIPT = [step(call("toolu_1", "desk.lookup", order="A-1")), final("looked up")]


@pytest.fixture
def code(stack, tmp_path: Path, monkeypatch) -> None:
    """The old code for this process (the runs start with it) and the workers that name it;
    the new code beside it, for the workers that name `desk_v2`."""
    install(stack, tmp_path / "site", monkeypatch, desk_v1=DESK_V1)
    write_module(tmp_path / "site", "desk_v2", DESK_V2)


def _start(stack, policy: str = "pinned") -> str:
    return stack.client.start_run(
        agent="desk",
        model={"provider": "scripted", "script": {"steps": SCRIPT}},
        user_input="look A-1 up",
        tools=["desk.lookup", "desk.refund"],
        definition_policy=policy,
    )


def test_a_pinned_run_waits_for_a_worker_whose_code_serves_it(stack, code) -> None:
    new = stack.worker("new", env={"LIYAGENT_TOOLS": "desk_v2"})
    run_id = _start(stack)
    until(lambda: stack.client.get(run_id).status == "waiting", "it never waited")
    view = stack.client.get(run_id)
    assert view.waiting_on is not None and view.waiting_on.startswith("definition:")
    [drift] = drift_audits(stack, run_id)
    assert drift["policy"] == "pinned"
    assert drift["changes"] == [
        {"what": "tool", "name": "desk.refund", "change": "gone", "was": "write", "now": None}
    ]
    # `deploy status` says which version waits for code that serves it (read at once: its
    # first retry is 2 s away).
    [version] = deploy_status(stack.engine, stack.sealer)
    assert (version.pin, version.policy, version.waiting_for_code) == (drift["pin"], "pinned", 1)
    # It retries on the new worker (woken at growing intervals), still unserved: audited once.
    time.sleep(3)
    assert stack.client.get(run_id).status in ("waiting", "queued", "running")
    assert len(drift_audits(stack, run_id)) == 1
    # A worker of the old code (a fleet mid-deploy runs both) serves it as it started.
    new.stop()
    stack.worker("old")
    view = stack.wait(run_id, timeout=60)
    assert view.status == "succeeded", view
    served = drift_audits(stack, run_id)[-1]
    assert served["served"] == drift["pin"] and served["waited_s"] > 0
    kinds = [e.kind for e in stack.client.events(run_id).events]
    assert "definition_drift" in kinds and "waiting" in kinds


def test_a_pinned_run_no_worker_serves_fails_after_its_wait_with_the_reason(stack, code) -> None:
    stack.worker("new", env={"LIYAGENT_TOOLS": "desk_v2", "LIYAGENT_DEFINITION_WAIT_S": "3"})
    run_id = _start(stack)
    view = stack.wait(run_id, timeout=60)
    assert view.status == "failed"
    assert "desk.refund is gone" in view.failure_reason
    assert "LIYAGENT_DEFINITION_WAIT_S=3" in view.failure_reason
    codes = stack.rows(
        "SELECT detail->>'code' AS code FROM audit_events WHERE run_id = :r "
        "AND kind = 'agent.run.failed'",
        r=run_id,
    )
    assert [c.code for c in codes] == ["definition_drift"]


def test_a_run_that_follows_the_latest_is_repinned_and_goes_on(stack, code) -> None:
    stack.worker("new", env={"LIYAGENT_TOOLS": "desk_v2"})
    run_id = _start(stack, "follow_latest")
    view = stack.wait(run_id, timeout=60)
    assert view.status == "succeeded", view
    [drift] = drift_audits(stack, run_id)
    assert drift["policy"] == "follow_latest" and drift["repinned"] != drift["pin"]
    assert drift["changes"][0]["name"] == "desk.refund"
    # Re-pinned: the next attempt on the same code finds nothing to say.
    assert stack.rows("SELECT drift_since FROM runs WHERE id = :r", r=run_id)[0].drift_since is None


def test_a_bad_policy_is_refused_at_the_door(stack, code) -> None:
    from runtime.core.enqueue import BadRequest

    with pytest.raises(BadRequest, match="definition_policy"):
        _start(stack, "sometimes")
    assert stack.rows("SELECT count(*) AS n FROM runs")[0].n == 0
