"""Every resume, a hand-on of a stored answer included, passes the gates as they stand now and
is audited as `agent.run.crash_resumed` with the step it started from (I7).

Each test SIGKILLs a real worker at a fault point, changes what the gates read while no worker
runs the run, then lets a survivor resume it; the verdict reads Postgres and the simulators'
own records only.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from liyagent.local.botframework import BotChannel, TeamsUser
from runtime.entries.teams.inbox import TeamsTurn, intake_teams, receive_teams
from store.gates import set_channel, set_principal
from tests.support.catalogs import write_catalog
from tests.support.scripts import mixed

pytestmark = pytest.mark.kill
ANSWER = "Answer from helper."
# Ann's Entra object id: her Teams turns' owner, the name a revocation gives her by.
ANN = "0b0a0000-0000-0000-0000-00000000a11e"
# The bot the workers reply as, in the tenant the turns come from.
BOT = BotChannel(tenant_id="t-1")


@pytest.fixture
def entries(stack, tmp_path):
    """The `helper` agent (a read, a comment, an answer); workers reply to Teams as a bot the
    connector simulator knows."""
    stack.reconfigure(agents_file=write_catalog(tmp_path / "agents.json", stack.sim_url))
    stack.extra_env.update(BOT.worker_env(stack.sim_url))
    return stack


def _teams_turn(stack, message_id: str) -> str:
    """A Teams activity from Ann in the inbox, taken in as a run; the run's id."""
    conversation = f"conv-{message_id}"
    activity = {
        "type": "message",
        "id": message_id,
        "serviceUrl": stack.sim_url,
        # A personal chat, with what Teams sends and a resumed hand-on reads Graph back with.
        "conversation": {"id": conversation, "conversationType": "personal", "tenantId": "t-1"},
        "from": {
            "id": "29:ann",
            "name": "ann",
            "aadObjectId": ANN,
        },
        "recipient": {"id": "28:bot", "name": "bot"},
        "text": "status of T-3?",
    }
    # Ann can write to the bot: its app is installed for her, with the chat this conversation is.
    BOT.install_personal(stack.sim_url, conversation, TeamsUser("ann", ANN))
    turn = TeamsTurn(message_id, conversation, stack.sim_url, ANN, activity["text"], activity)
    receive_teams(stack.services, turn, "helper")
    [run_id] = intake_teams(stack.services)
    return run_id


def _requests(stack, run_id: str) -> list[tuple[Any, ...]]:
    """Every request of the run any simulator received (model included), in order."""
    rows = stack.vendor(
        "SELECT id, vendor, method, path FROM sim.requests WHERE run_id = :r ORDER BY id",
        r=run_id,
    )
    return [tuple(r) for r in rows]


def _resumed(stack, run_id: str) -> list[Any]:
    return stack.rows(
        "SELECT step, detail FROM audit_events WHERE run_id = :r "
        "AND kind = 'agent.run.crash_resumed' ORDER BY id",
        r=run_id,
    )


def _failure_codes(stack, run_id: str) -> list[str]:
    rows = stack.rows(
        "SELECT detail->>'code' AS code FROM audit_events WHERE run_id = :r "
        "AND kind = 'agent.run.failed' ORDER BY id",
        r=run_id,
    )
    return [r.code for r in rows]


def _stop_run(stack, run_id: str) -> None:
    # The product's own Stop path; an answered run (its answer stored) is left to its hand-on,
    # which passes the gates as they stand.
    assert stack.client.stop(run_id=run_id, reason="runaway", by="oncall") == []


def _stop_agent(stack, run_id: str) -> None:
    assert stack.client.stop(agent="helper", reason="incident", by="oncall") == []


def _revoke_owner(stack, run_id: str) -> None:
    with stack.db() as conn:
        set_principal(conn, ANN, may_run=False, may_act=True, reason="left the company")


def _disable_channel(stack, run_id: str) -> None:
    with stack.db() as conn:
        set_channel(conn, "teams", enabled=False, reason="tenant offboarded")


def _revoke_run_as(stack, run_id: str) -> None:
    with stack.db() as conn:
        set_principal(conn, ANN, may_run=True, may_act=False, reason="key rotated")


GATE_CHANGES: dict[str, tuple[Callable[[Any, str], None], str]] = {
    "run_stopped": (_stop_run, "stopped by oncall: runaway"),
    "agent_stopped": (_stop_agent, "stopped by oncall: incident"),
    "owner_revoked": (_revoke_owner, f"its owner {ANN} may no longer run it (left the company)"),
    "channel_disabled": (_disable_channel, "its channel teams is disabled (tenant offboarded)"),
    "run_as_revoked": (
        _revoke_run_as,
        f"the principal it acts as, {ANN}, may no longer act (key rotated)",
    ),
}


@pytest.mark.parametrize("change", list(GATE_CHANGES))
def test_a_refused_hand_on_fails_the_turn_and_posts_nothing(entries, change) -> None:
    """A Teams turn lost after its answer was stored is handed on only through the gates as
    they stand now: a Stop, a revoked owner or run-as, a disabled channel meanwhile fail the
    run with the reason, told to its inbox row and transcript, and nothing is posted."""
    apply, reason = GATE_CHANGES[change]
    run_id = entries.kill_at("after_answer:kill", lambda: _teams_turn(entries, f"msg-{change}"))
    assert entries.rows("SELECT status FROM runs WHERE id = :r", r=run_id)[0].status == "answered"
    before = _requests(entries, run_id)
    apply(entries, run_id)
    entries.worker("survivor")
    entries.beat()

    view = entries.wait(run_id)
    assert view.status == "failed" and view.lost_count == 1, view
    assert reason in view.failure_reason
    # Nothing of this run reached any simulator after the kill: no token, no read-back, no post.
    assert _requests(entries, run_id) == before
    assert not any(vendor in {"connector", "login"} for _, vendor, _, _ in before)
    posted = entries.vendor(
        "SELECT count(*) AS n FROM sim.connector_activities WHERE conversation = :c",
        c=f"conv-msg-{change}",
    )[0].n
    assert posted == 0
    inbox = entries.rows("SELECT status, reply FROM teams_inbox WHERE run_id = :r", r=run_id)[0]
    assert (inbox.status, inbox.reply) == ("failed", None)
    transcript = entries.client.transcript(run_id)
    assert [role for role, _ in transcript] == ["user", "notice"]
    assert reason in transcript[-1][1]
    assert _failure_codes(entries, run_id) == ["gate_refused"]
    assert _resumed(entries, run_id) == []  # refused before it resumed anything
    assert set(entries.asked(run_id).values()) == {1}  # the turn itself ran once


def test_a_hand_on_is_audited_as_a_resume_of_its_stored_answer(entries) -> None:
    """A hand-on is a resume: audited with the step the run stood at, its loss count, and that
    it handed on the stored answer with no calls to settle."""
    run_id = entries.kill_at("after_answer:kill", lambda: _teams_turn(entries, "msg-audit"))
    [lost] = entries.rows("SELECT status, step FROM runs WHERE id = :r", r=run_id)
    assert (lost.status, lost.step) == ("answered", 2)  # read, comment, then the answer
    entries.worker("survivor")
    entries.beat()

    view = entries.wait(run_id)
    assert view.status == "succeeded" and view.lost_count == 1, view
    [resumed] = _resumed(entries, run_id)
    assert resumed.step == lost.step
    assert resumed.detail["lost_count"] == 1 and resumed.detail["reason"] == "lost"
    assert resumed.detail["resumed_from"] == "stored_answer"
    assert resumed.detail["calls"] == []
    posted = entries.vendor(
        "SELECT activity FROM sim.connector_activities WHERE idem_key = :k",
        k=f"lya-teams-reply-{run_id}",
    )
    assert [p.activity["text"] for p in posted] == [ANSWER]
    assert set(entries.asked(run_id).values()) == {1}


def test_a_stop_between_the_kill_and_the_resume_refuses_the_calls_left(stack) -> None:
    """Killed with a keyed write marked in doubt (a resume would send it again), stopped while
    no worker runs it: the Stop fails it at once, it is never resumed, and none of the calls
    its checkpoint left is made."""
    run_id = stack.kill_at("after_mark:kill", lambda: stack.start(mixed("s")))
    [lost] = stack.rows("SELECT status, step FROM runs WHERE id = :r", r=run_id)
    assert (lost.status, lost.step) == ("running", 1)
    marked = stack.rows(
        "SELECT tool, status FROM call_marks WHERE run_id = :r ORDER BY tool", r=run_id
    )
    assert [(m.tool, m.status) for m in marked] == [("incident.create", "in_doubt")]
    before = _requests(stack, run_id)
    # A Stop ends a running run at once, its attempt fenced out: the lost one is never resumed.
    assert stack.client.stop(run_id=run_id, reason="runaway", by="oncall") == [run_id]
    stack.worker("survivor")
    stack.beat()

    view = stack.wait(run_id)
    assert view.status == "failed" and view.lost_count == 0, view
    assert "stopped by oncall: runaway" in view.failure_reason
    assert _requests(stack, run_id) == before  # no call left, and no model step, was made
    incidents = stack.vendor(
        "SELECT count(*) AS n FROM sim.requests WHERE run_id = :r AND vendor = 'incidents'",
        r=run_id,
    )[0].n
    assert incidents == 0
    assert _failure_codes(stack, run_id) == ["stopped"]
    assert _resumed(stack, run_id) == []
    assert stack.asked(run_id) == {1: 1}


def test_crash_resumed_records_the_step_its_resume_started_from(stack) -> None:
    """Killed after its second checkpoint: the resume's audit names that checkpoint's step, not
    the first one or the step the run ended at."""
    run_id = stack.kill_at("after_checkpoint:kill:2", lambda: stack.start(mixed("t")))
    [lost] = stack.rows("SELECT status, step FROM runs WHERE id = :r", r=run_id)
    assert (lost.status, lost.step) == ("running", 2)
    stack.worker("survivor")
    stack.beat()

    view = stack.wait(run_id)
    assert view.status == "succeeded" and view.step > lost.step, view
    [resumed] = _resumed(stack, run_id)
    assert resumed.step == lost.step
    assert resumed.detail["lost_count"] == 1
    assert resumed.detail["resumed_from"] == "checkpoint"
    assert [(c["tool"], c["settled"]) for c in resumed.detail["calls"]] == [
        ("issue.comment", "made")
    ]
