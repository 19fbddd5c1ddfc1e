"""Failure paths, each judged from Postgres and the vendors' own records: a keyed write that
fails in doubt is sent again with its key; any other write in doubt is read back or reported,
never sent again; a sealed value that does not verify fails the run at once; a refused hand-on
fails the run with its reason, and repeated losses after the answer are capped."""

from __future__ import annotations

import json

import pytest

from tests.support.scripts import call, final, step


def _start_unworked(stack, steps) -> str:
    """A queued run no worker has taken yet (so a vendor fault can be armed for it first)."""
    return stack.start(steps)


def _incidents(stack, run_id: str) -> int:
    return stack.vendor(
        "SELECT count(*) AS n FROM sim.incidents WHERE idem_key IN "
        "(SELECT idem_key FROM sim.requests WHERE run_id = :r)",
        r=run_id,
    )[0].n


def _posts(stack, run_id: str, vendor: str) -> list:
    return stack.vendor(
        "SELECT idem_key, status, deduped FROM sim.requests WHERE run_id = :r AND vendor = :v "
        "AND method = 'POST' ORDER BY id",
        r=run_id,
        v=vendor,
    )


def _marks(stack, run_id: str) -> list[tuple[str, str, str | None]]:
    rows = stack.rows(
        "SELECT tool, status, settlement FROM call_marks WHERE run_id = :r ORDER BY step",
        r=run_id,
    )
    return [(m.tool, m.status, m.settlement) for m in rows]


INCIDENT = [step(call("toolu_f_inc", "incident.create", title="Checkout down")), final()]
COMMENT = [step(call("toolu_f_com", "issue.comment", issue="ENG-4", body="seen")), final()]


def test_a_keyed_write_answered_5xx_after_landing_is_sent_again_with_its_key(stack) -> None:
    run_id = _start_unworked(stack, INCIDENT)
    stack.fault(run_id, "POST", "/incidents", 503, after=True)
    stack.worker("w1")
    assert stack.wait(run_id).status == "succeeded"
    posts = _posts(stack, run_id, "incidents")
    assert [(p.status, p.deduped) for p in posts] == [(503, False), (200, True)]
    assert len({p.idem_key for p in posts}) == 1
    assert _incidents(stack, run_id) == 1
    assert _marks(stack, run_id) == [("incident.create", "done", "resent")]
    assert stack.told(run_id, 2)[0]["title"] == "Checkout down"  # told the incident, not unknown


def test_a_keyed_write_whose_answer_never_comes_is_retried_then_reported(stack) -> None:
    run_id = _start_unworked(stack, INCIDENT)
    stack.fault(run_id, "POST", "/incidents", 502, after=True, times=20)
    stack.worker("w1")
    assert stack.wait(run_id).status == "succeeded"
    posts = _posts(stack, run_id, "incidents")
    assert len(posts) == 4 and len({p.idem_key for p in posts}) == 1  # bounded, one key
    assert _incidents(stack, run_id) == 1  # the vendor deduped every retry
    assert _marks(stack, run_id) == [("incident.create", "settled", "unknown")]
    assert stack.told(run_id, 2)[0]["outcome"] == "unknown"


def test_a_write_with_a_reader_answered_5xx_after_landing_is_read_back(stack) -> None:
    run_id = _start_unworked(stack, COMMENT)
    stack.fault(run_id, "POST", "/issues/", 500, after=True)
    stack.worker("w1")
    assert stack.wait(run_id).status == "succeeded"
    assert len(_posts(stack, run_id, "issues")) == 1
    assert _marks(stack, run_id) == [("issue.comment", "done", "read_back")]
    assert stack.told(run_id, 2)[0]["body"] == "seen"


def test_a_write_with_a_reader_that_did_not_land_is_not_sent_again(stack) -> None:
    run_id = _start_unworked(stack, COMMENT)
    stack.fault(run_id, "POST", "/issues/", 503)  # refused before any effect
    stack.worker("w1")
    assert stack.wait(run_id).status == "succeeded"
    assert len(_posts(stack, run_id, "issues")) == 1  # never sent a second time
    assert _marks(stack, run_id) == [("issue.comment", "settled", "not_found")]
    told = stack.told(run_id, 2)[0]
    assert told["outcome"] == "not_found" and "not sent again" in told["note"]


REMOTE = [step(call("toolu_f_a2a", "remote.ask", agent="billing", message="refund?")), final()]


def test_a_remote_agent_answered_5xx_after_landing_is_read_back_by_its_task_id(stack) -> None:
    run_id = _start_unworked(stack, REMOTE)
    stack.fault(run_id, "POST", "/a2a", 503, after=True)
    stack.worker("w1")
    assert stack.wait(run_id).status == "succeeded"
    calls = stack.vendor(
        "SELECT status, body->>'method' AS method FROM sim.requests WHERE run_id = :r "
        "AND vendor = 'a2a' ORDER BY id",
        r=run_id,
    )
    assert [(c.method, c.status) for c in calls] == [("SendMessage", 503), ("GetTask", 200)]
    assert _marks(stack, run_id) == [("remote.ask", "done", "read_back")]
    told = stack.told(run_id, 2)[0]
    assert told["state"] == "completed" and told["answer"] == "billing handled: refund?"


def test_a_remote_agent_refusing_the_message_is_told_not_read_back(stack) -> None:
    run_id = _start_unworked(stack, REMOTE)
    stack.fault(run_id, "POST", "/a2a", 400)
    stack.worker("w1")
    assert stack.wait(run_id).status == "succeeded"
    assert len(_posts(stack, run_id, "a2a")) == 1
    assert "400" in json.dumps(stack.told(run_id, 2)[0])


@pytest.mark.kill
@pytest.mark.parametrize("fault", ["after_mark:kill", "after_send:kill"])
def test_an_incident_update_in_flight_is_sent_again_with_its_key(stack, fault) -> None:
    opened = stack.start([step(call("toolu_open", "incident.create", title="Disk full")), final()])
    stack.worker("w0")
    assert stack.wait(opened).status == "succeeded"
    incident = stack.told(opened, 2)[0]["id"]
    stack.procs.pop().kill()
    steps = [
        step(call("toolu_upd", "incident.update", incident=incident, body="mitigated")),
        final(),
    ]
    run_id = stack.kill_then_resume(fault, lambda: stack.start(steps))
    assert stack.wait(run_id).status == "succeeded"
    updates = stack.vendor(
        "SELECT count(*) AS n FROM sim.incident_updates WHERE incident_id = :i", i=incident
    )[0].n
    assert updates == 1
    posts = _posts(stack, run_id, "incidents")
    assert len({p.idem_key for p in posts}) == 1 and all(p.deduped for p in posts[1:])
    resumed = stack.rows(
        "SELECT detail FROM audit_events WHERE run_id = :r AND kind = 'agent.run.crash_resumed'",
        r=run_id,
    )
    assert [c["settled"] for c in resumed[0].detail["calls"]] == ["resent"]


@pytest.mark.kill
def test_a_tampered_call_outcome_fails_the_run_at_once(stack) -> None:
    steps = [
        step(call("toolu_t1", "incident.create", title="x")),
        step(call("toolu_t2", "ticket.read", ticket="T-1")),
        final(),
    ]
    stack.worker("victim", fault="after_outcome:kill")
    run_id = stack.start(steps)
    stack.fault_hit("victim")
    stack.procs[-1].popen.wait(timeout=10)
    stack.rows(
        "UPDATE call_marks SET outcome = set_byte(outcome, 30, get_byte(outcome, 30) # 1) "
        "WHERE run_id = :r RETURNING 1",
        r=run_id,
    )
    stack.worker("survivor")
    stack.beat()
    view = stack.wait(run_id)
    assert view.status == "failed" and view.lost_count == 1  # at once, not after three losses
    assert "does not verify" in view.failure_reason
    codes = stack.rows(
        "SELECT detail->>'code' AS code FROM audit_events WHERE run_id = :r "
        "AND kind = 'agent.run.failed'",
        r=run_id,
    )
    assert [c.code for c in codes] == ["seal_failed"]
    assert stack.asked(run_id) == {1: 1}  # the tampered outcome never reached the model


def test_a_tampered_answer_of_a_finished_run_shows_that_it_does_not_verify(stack) -> None:
    stack.worker("w1")
    run_id = stack.start([final("All good.")])
    assert stack.wait(run_id).answer == "All good."
    stack.rows(
        "UPDATE runs SET answer = set_byte(answer, 30, get_byte(answer, 30) # 1) "
        "WHERE id = :r RETURNING 1",
        r=run_id,
    )
    for _ in range(2):
        view = stack.client.get(run_id)
        assert view.answer is None and "does not verify" in (view.answer_error or "")
    audited = stack.rows(
        "SELECT count(*) AS n FROM audit_events WHERE run_id = :r "
        "AND kind = 'agent.answer.unverified'",
        r=run_id,
    )
    assert audited[0].n == 1
