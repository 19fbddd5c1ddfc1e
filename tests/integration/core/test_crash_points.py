"""A worker SIGKILLed at each named point of a run; a second worker resumes it.

Each run reads, makes a keyed write (incident), a write with a reader (comment) and a write
with neither (chat reply). The verdict reads Postgres and the vendor simulator's records only.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from tests.support.scripts import mixed


@dataclass(frozen=True)
class Case:
    fault: str
    # Vendor records expected at the end: incident rows, comment rows, chat reply rows.
    incidents: int = 1
    comments: int = 1
    chats: int = 1
    # (tool, settlement) the crash_resumed audit must report, if any call was left.
    settled: tuple[tuple[str, str], ...] = ()
    # The model step asked twice (its answer was never written), if any.
    asked_twice: int | None = None
    # Losses: none when the kill came after the run had ended.
    lost: int = 1


CASES = [
    Case("after_claim:kill"),
    Case("after_model_step:kill", asked_twice=1),
    Case("after_checkpoint:kill", settled=(("ticket.read", "made"), ("incident.create", "made"))),
    Case("after_mark:kill", settled=(("ticket.read", "made"), ("incident.create", "resent"))),
    # Marked, never sent: the reader finds nothing, and it is not sent again (the vendor might
    # still be processing a request the lost attempt made); the model is told.
    Case("after_mark:kill:2", comments=0, settled=(("issue.comment", "not_found"),)),
    Case("after_mark:kill:3", chats=0, settled=(("chat.reply", "unknown"),)),
    Case("after_send:kill", settled=(("ticket.read", "made"), ("incident.create", "resent"))),
    Case("after_send:kill:2", settled=(("issue.comment", "read_back"),)),
    Case("after_send:kill:3", settled=(("chat.reply", "unknown"),)),
    Case("after_outcome:kill", settled=(("ticket.read", "made"), ("incident.create", "reused"))),
    # The answer is stored and handed on (transcript) in one statement: a kill right after it
    # finds the run ended, and nothing is resumed or asked again.
    Case("after_answer:kill", lost=0),
]


@pytest.mark.kill
@pytest.mark.parametrize("case", CASES, ids=[c.fault for c in CASES])
def test_killed_worker_run_resumes_once(stack, case: Case) -> None:
    victim = stack.worker("victim", fault=case.fault)
    run_id = stack.start(mixed("k"))
    stack.fault_hit("victim")
    victim.popen.wait(timeout=10)  # the fault SIGKILLed the worker's whole process group
    stack.worker("survivor")
    stack.beat()
    view = stack.wait(run_id, timeout=60)

    assert view.status == "succeeded", view
    assert view.lost_count == case.lost and view.attempt == 1 + case.lost
    assert stack.client.transcript(run_id)[-1] == ("assistant", "Handled k.")
    assert sum(1 for role, _ in stack.client.transcript(run_id) if role == "assistant") == 1

    incidents = stack.vendor(
        "SELECT count(*) AS n FROM sim.incidents i JOIN sim.requests r "
        "ON r.idem_key = i.idem_key AND r.run_id = :r AND r.vendor = "
        "'incidents' AND r.status = 201",
        r=run_id,
    )[0].n
    comments = stack.vendor(
        "SELECT count(*) AS n FROM sim.comments c WHERE c.idem_key IN "
        "(SELECT idem_key FROM sim.requests WHERE run_id = :r)",
        r=run_id,
    )[0].n
    chats = stack.vendor(
        "SELECT count(*) AS n FROM sim.chat_replies c WHERE c.idem_key IN "
        "(SELECT idem_key FROM sim.requests WHERE run_id = :r)",
        r=run_id,
    )[0].n
    assert (incidents, comments, chats) == (case.incidents, case.comments, case.chats)
    # Every incident create that reached the vendor twice carried one key and was deduped.
    creates = stack.vendor(
        "SELECT idem_key, deduped FROM sim.requests WHERE run_id = :r AND "
        "vendor = 'incidents' AND method = 'POST' ORDER BY id",
        r=run_id,
    )
    assert len({c.idem_key for c in creates}) == 1
    assert [c.deduped for c in creates][1:] == [True] * (len(creates) - 1)

    asked = stack.asked(run_id)
    expected = {s: 1 for s in range(1, 5)}
    if case.asked_twice:
        expected[case.asked_twice] = 2
    assert asked == expected, "a written step was asked of the model again (I5)"

    audit = stack.rows(
        "SELECT kind, step, detail FROM audit_events WHERE run_id = :r ORDER BY id", r=run_id
    )
    kinds = [a.kind for a in audit]
    if case.fault.startswith("after_answer"):
        assert "agent.run.crash_resumed" not in kinds  # the answer was handed on, not re-run
    else:
        resumed = [a for a in audit if a.kind == "agent.run.crash_resumed"]
        assert len(resumed) == 1
        assert resumed[0].detail["lost_count"] == 1
        got = tuple((c["tool"], c["settled"]) for c in resumed[0].detail["calls"])
        assert got == case.settled
    assert kinds.count("agent.run.lost") == case.lost

    if case.comments == 0:
        outcome = stack.told_by_tool(run_id, 3)["issue.comment"]
        assert outcome["outcome"] == "not_found" and "not sent again" in outcome["note"]
    if case.chats == 0:
        marks = stack.rows(
            "SELECT status, settlement FROM call_marks WHERE run_id = :r AND tool = 'chat.reply'",
            r=run_id,
        )
        assert [(m.status, m.settlement) for m in marks] == [("settled", "unknown")]
        # What the model was told when asked for the next step, as recorded by the provider.
        outcome = stack.told_by_tool(run_id, 4)["chat.reply"]
        assert outcome["outcome"] == "unknown" and "not sent again" in outcome["note"]
