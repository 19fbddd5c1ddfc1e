"""One test per row of the spec's "Writes in flight" table: the worker is SIGKILLed while the
call is in doubt and a second worker resumes. Judged from the vendor's records and Postgres."""

from __future__ import annotations

import json

import pytest

from tests.support.scripts import call, final, step

pytestmark = pytest.mark.kill


def _settled(stack, run_id: str) -> list[tuple[str, str]]:
    rows = stack.rows(
        "SELECT detail FROM audit_events WHERE run_id = :r AND kind = 'agent.run.crash_resumed'",
        r=run_id,
    )
    return [(c["tool"], c["settled"]) for r in rows for c in r.detail["calls"]]


def _told(stack, run_id: str, step: int) -> list[dict]:
    return stack.told(run_id, step)


def test_read_in_flight_is_made_again(stack) -> None:
    steps = [step(call("toolu_r1", "ticket.read", ticket="T-9")), final()]
    run_id = stack.kill_then_resume("after_checkpoint:kill", lambda: stack.start(steps))
    assert stack.wait(run_id).status == "succeeded"
    reads = stack.vendor(
        "SELECT attempt FROM sim.requests WHERE run_id = :r AND vendor = 'tickets' ORDER BY id",
        r=run_id,
    )
    assert [r.attempt for r in reads] == [2]  # never made before the kill; made once after
    assert _settled(stack, run_id) == [("ticket.read", "made")]


def test_read_made_before_the_crash_is_made_again(stack) -> None:
    steps = [
        step(
            call("toolu_r2", "ticket.read", ticket="T-9"),
            call("toolu_w2", "issue.comment", issue="ENG-1", body="x"),
        ),
        final(),
    ]
    run_id = stack.kill_then_resume("after_mark:kill", lambda: stack.start(steps))
    assert stack.wait(run_id).status == "succeeded"
    reads = stack.vendor(
        "SELECT attempt FROM sim.requests WHERE run_id = :r AND vendor = 'tickets' ORDER BY id",
        r=run_id,
    )
    assert [r.attempt for r in reads] == [1, 2]  # harmless, so simply made again


def test_keyed_write_with_long_window_is_sent_again_with_the_same_key(stack) -> None:
    steps = [step(call("toolu_k1", "incident.create", title="DB down")), final()]
    run_id = stack.kill_then_resume("after_send:kill", lambda: stack.start(steps))
    assert stack.wait(run_id).status == "succeeded"
    posts = stack.vendor(
        "SELECT idem_key, deduped, attempt FROM sim.requests WHERE run_id = :r "
        "AND vendor = 'incidents' ORDER BY id",
        r=run_id,
    )
    assert [(p.deduped, p.attempt) for p in posts] == [(False, 1), (True, 2)]
    assert len({p.idem_key for p in posts}) == 1
    rows = stack.vendor(
        "SELECT count(*) AS n FROM sim.incidents WHERE idem_key = :k", k=posts[0].idem_key
    )
    assert rows[0].n == 1
    assert _settled(stack, run_id) == [("incident.create", "resent")]


@pytest.mark.parametrize(("fault", "sent"), [("after_mark:kill", 0), ("after_send:kill", 1)])
def test_keyed_write_with_short_window_is_settled_not_sent_again(stack, fault, sent) -> None:
    steps = [step(call("toolu_n1", "notify.send", channel="#ops", text="paging")), final()]
    run_id = stack.kill_then_resume(fault, lambda: stack.start(steps))
    assert stack.wait(run_id).status == "succeeded"
    posts = stack.vendor(
        "SELECT attempt FROM sim.requests WHERE run_id = :r AND vendor = 'notify'", r=run_id
    )
    assert len(posts) == sent and all(p.attempt == 1 for p in posts)
    assert _settled(stack, run_id) == [("notify.send", "unknown")]
    assert _told(stack, run_id, 2)[0]["outcome"] == "unknown"


def test_write_with_a_reader_found_by_read_back_reuses_its_outcome(stack) -> None:
    steps = [step(call("toolu_c1", "issue.comment", issue="ENG-7", body="found it")), final()]
    run_id = stack.kill_then_resume("after_send:kill", lambda: stack.start(steps))
    assert stack.wait(run_id).status == "succeeded"
    comments = stack.vendor(
        "SELECT count(*) AS n FROM sim.comments WHERE idem_key IN (SELECT "
        "idem_key FROM sim.requests WHERE run_id = :r)",
        r=run_id,
    )[0].n
    assert comments == 1
    assert _settled(stack, run_id) == [("issue.comment", "read_back")]
    assert _told(stack, run_id, 2)[0]["body"] == "found it"
    # The mark names the attempt that last wrote it: the resume, not the lost attempt.
    marks = stack.rows("SELECT attempt, status FROM call_marks WHERE run_id = :r", r=run_id)
    assert [(m.attempt, m.status) for m in marks] == [(2, "done")]


def test_write_not_found_by_read_back_is_not_sent_again(stack) -> None:
    """An empty read-back is no permission to send: the lost attempt's request may still be
    in the vendor's hands. The model is told, and the settlement is audited."""
    steps = [step(call("toolu_c1", "issue.comment", issue="ENG-7", body="found it")), final()]
    run_id = stack.kill_then_resume("after_mark:kill", lambda: stack.start(steps))
    assert stack.wait(run_id).status == "succeeded"
    posts = stack.vendor(
        "SELECT count(*) AS n FROM sim.requests WHERE run_id = :r AND vendor = 'issues' "
        "AND method = 'POST'",
        r=run_id,
    )[0].n
    assert posts == 0
    assert _settled(stack, run_id) == [("issue.comment", "not_found")]
    told = _told(stack, run_id, 2)[0]
    assert told["outcome"] == "not_found" and "not sent again" in told["note"]
    marks = stack.rows(
        "SELECT attempt, status, settlement FROM call_marks WHERE run_id = :r", r=run_id
    )
    assert [(m.attempt, m.status, m.settlement) for m in marks] == [(2, "settled", "not_found")]
    audited = stack.rows(
        "SELECT detail FROM audit_events WHERE run_id = :r AND kind = 'agent.call.settled'",
        r=run_id,
    )
    assert [a.detail["settlement"] for a in audited] == ["not_found"]


@pytest.mark.parametrize(("fault", "sent"), [("after_mark:kill", 0), ("after_send:kill", 1)])
def test_other_write_is_reported_unknown_and_not_sent_again(stack, fault, sent) -> None:
    steps = [step(call("toolu_m1", "chat.reply", conversation="c1", text="hello")), final()]
    run_id = stack.kill_then_resume(fault, lambda: stack.start(steps))
    assert stack.wait(run_id).status == "succeeded"
    posts = stack.vendor(
        "SELECT attempt FROM sim.requests WHERE run_id = :r AND vendor = 'chat'", r=run_id
    )
    assert len(posts) == sent
    told = _told(stack, run_id, 2)[0]
    assert told["outcome"] == "unknown" and "not sent again" in told["note"]
    audit = stack.rows(
        "SELECT detail FROM audit_events WHERE run_id = :r AND kind = 'agent.run.crash_resumed'",
        r=run_id,
    )
    assert audit[0].detail["calls"] == [
        {"call_id": "toolu_m1", "tool": "chat.reply", "kind": "write", "settled": "unknown"}
    ]


@pytest.mark.parametrize(
    ("fault", "how", "tasks"),
    [("after_mark:kill", "not_found", []), ("after_send:kill", "read_back", [1])],
)
def test_remote_agent_call_is_read_back_by_its_task_id(stack, fault, how, tasks) -> None:
    steps = [
        step(call("toolu_a1", "remote.ask", agent="billing-agent", message="refund?")),
        final(),
    ]
    run_id = stack.kill_then_resume(fault, lambda: stack.start(steps))
    assert stack.wait(run_id).status == "succeeded"
    found = stack.vendor(
        "SELECT task_id, count(*) AS n FROM sim.a2a_tasks WHERE task_id IN "
        "(SELECT idem_key FROM sim.requests WHERE run_id = :r) GROUP BY task_id",
        r=run_id,
    )
    assert [t.n for t in found] == tasks
    assert _settled(stack, run_id) == [("remote.ask", how)]
    told = json.dumps(_told(stack, run_id, 2))
    assert ("billing-agent handled" in told) == (how == "read_back")


def test_write_reclassified_as_read_is_still_settled_as_a_write(stack) -> None:
    # The run follows the latest definition, so the new code's serves it (re-pinned): the
    # call marked as a write before stays one (I7). A pinned run waits instead
    # (tests/integration/durable/test_pins.py).
    stack.worker("victim", fault="after_mark:kill")
    run_id = stack.start(
        [step(call("toolu_m2", "chat.reply", conversation="c", text="x")), final()],
        definition_policy="follow_latest",
    )
    stack.fault_hit("victim")
    stack.procs[-1].popen.wait(timeout=10)
    # An operator reclassifies the tool as a read before the resume.
    stack.worker("survivor", env={"LIYAGENT_TOOL_KINDS": "chat.reply=read"})
    stack.beat()
    assert stack.wait(run_id).status == "succeeded"
    [drift] = stack.rows(
        "SELECT detail FROM audit_events WHERE run_id = :r AND kind = 'agent.run.definition_drift'",
        r=run_id,
    )
    assert [(c["name"], c["change"], c["was"], c["now"]) for c in drift.detail["changes"]] == [
        ("chat.reply", "kind", "write", "read")
    ]
    assert (
        stack.vendor(
            "SELECT count(*) AS n FROM sim.requests WHERE run_id = :r AND vendor = 'chat'", r=run_id
        )[0].n
        == 0
    )
    assert _settled(stack, run_id) == [("chat.reply", "unknown")]
    kinds = stack.rows("SELECT kind, status FROM call_marks WHERE run_id = :r", r=run_id)
    assert [(k.kind, k.status) for k in kinds] == [("write", "settled")]


@pytest.mark.parametrize(("fault", "sent"), [("after_mark:kill", 0), ("after_send:kill", 1)])
def test_positional_id_write_in_doubt_is_settled_and_never_sent_again(stack, fault, sent) -> None:
    """A provider whose tool-call ids only number their position (`call_0`) asks a plain write
    (no reader); the worker dies with it in doubt. No stable key was derived from the id (I8),
    and the resume tells the model the outcome is unknown without sending it again (I2)."""
    steps = [step(call("call_0", "chat.reply", conversation="c0", text="hello")), final()]
    run_id = stack.kill_then_resume(fault, lambda: stack.start(steps))
    view = stack.wait(run_id)
    assert view.status == "succeeded" and view.lost_count == 1
    posts = stack.vendor(
        "SELECT attempt, idem_key FROM sim.requests WHERE run_id = :r AND vendor = 'chat'",
        r=run_id,
    )
    assert [p.attempt for p in posts] == [1] * sent  # 0 or 1 request, from the lost attempt
    [mark] = stack.rows(
        "SELECT call_id, stable_key, idem_key, status, settlement FROM call_marks "
        "WHERE run_id = :r",
        r=run_id,
    )
    assert (mark.call_id, mark.status, mark.settlement) == ("call_0", "settled", "unknown")
    # The key the write carried is fresh for that call, never one derived from `call_0`.
    assert mark.stable_key is False and mark.idem_key.startswith("lya-adhoc-")
    assert [p.idem_key for p in posts] == [mark.idem_key] * sent
    told = _told(stack, run_id, 2)[0]
    assert told["outcome"] == "unknown" and "not sent again" in told["note"]
    assert _settled(stack, run_id) == [("chat.reply", "unknown")]


@pytest.mark.parametrize(("fault", "sent"), [("after_mark:kill", 0), ("after_send:kill", 1)])
def test_positional_id_keyed_write_in_doubt_is_never_sent_again(stack, fault, sent) -> None:
    """A keyed write (its vendor dedupes on the key for longer than a resume takes) is sent
    again with its key after a crash: but only a key derived from a stable tool-call id can
    find the first request. Asked with a positional id (`call_0`), it got a fresh key (I8), so
    sending it again could make a second incident: the resume settles it instead (I2). Judged
    from the vendor's records: at most the lost attempt's one request, one incident."""
    steps = [step(call("call_0", "incident.create", title="DB down")), final()]
    run_id = stack.kill_then_resume(fault, lambda: stack.start(steps))
    view = stack.wait(run_id)
    assert view.status == "succeeded" and view.lost_count == 1
    posts = stack.vendor(
        "SELECT attempt, idem_key FROM sim.requests WHERE run_id = :r AND vendor = 'incidents'",
        r=run_id,
    )
    assert [p.attempt for p in posts] == [1] * sent
    [mark] = stack.rows(
        "SELECT call_id, stable_key, idem_key, status, settlement FROM call_marks "
        "WHERE run_id = :r",
        r=run_id,
    )
    assert (mark.call_id, mark.status, mark.stable_key) == ("call_0", "settled", False)
    assert mark.idem_key.startswith("lya-adhoc-")
    incidents = stack.vendor(
        "SELECT count(*) AS n FROM sim.incidents WHERE idem_key = :k", k=mark.idem_key
    )
    assert incidents[0].n == sent
    told = _told(stack, run_id, 2)[0]
    assert told["outcome"] == "unknown" and "not sent again" in told["note"]
    assert _settled(stack, run_id) == [("incident.create", "unknown")]
