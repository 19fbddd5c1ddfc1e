"""Every row of the spec's "Which runs survive a crash" for entry points: the worker is
SIGKILLed in flight; the verdict reads Postgres and the vendor simulator's records."""

from __future__ import annotations

import time
from datetime import UTC, datetime

import httpx
import pytest

from liyagent.local.botframework import BotChannel, TeamsUser
from runtime.core.deps import DoorDeps
from runtime.core.enqueue import BadRequest, NewRun, enqueue
from runtime.entries.cron import fire_cron
from runtime.entries.start import start_entry
from runtime.entries.teams.inbox import TeamsTurn, intake_teams, receive_teams
from store.a2a import a2a_link
from store.entries import purge_answers
from tests.support.catalogs import helper_agent, write_catalog
from tests.support.front import AUTH, serve_front

pytestmark = pytest.mark.kill
ANSWER = "Answer from helper."
# Ann's Entra object id: her Teams turns' owner.
ANN = "0b0a0000-0000-0000-0000-00000000a11e"
# The bot the workers reply as, in the tenant the turns come from.
BOT = BotChannel(tenant_id="t-1")


@pytest.fixture
def entries(stack, tmp_path):
    # Hourly: the beats these tests start never fire it themselves.
    stack.reconfigure(
        agents_file=write_catalog(tmp_path / "agents.json", stack.sim_url, cron_every_s=3600)
    )
    # The workers reply to Teams turns as a bot the connector simulator knows.
    stack.extra_env.update(BOT.worker_env(stack.sim_url))
    return stack


def _turn(entries, activity_id: str, conversation: str, text: str = "status of T-3?") -> None:
    """Put a Teams activity in the inbox, replied to at the connector simulator."""
    activity = {
        "type": "message",
        "id": activity_id,
        "serviceUrl": entries.sim_url,
        # A personal chat, with what Teams sends and a resumed hand-on reads Graph back with.
        "conversation": {"id": conversation, "conversationType": "personal", "tenantId": "t-1"},
        "from": {
            "id": "29:ann",
            "name": "ann",
            "aadObjectId": ANN,
        },
        "recipient": {"id": "28:bot", "name": "bot"},
        "text": text,
    }
    # Ann can write to the bot: its app is installed for her, with the chat this conversation is.
    BOT.install_personal(entries.sim_url, conversation, TeamsUser("ann", ANN))
    turn = TeamsTurn(activity_id, conversation, entries.sim_url, ANN, text, activity)
    receive_teams(entries.services, turn, "helper")


def _replies(entries, run_id: str):
    return entries.vendor(
        "SELECT conversation, activity FROM sim.connector_activities WHERE idem_key = :k",
        k=f"lya-teams-reply-{run_id}",
    )


def _assistant_lines(stack, run_id: str) -> list[str]:
    return [text for role, text in stack.client.transcript(run_id) if role == "assistant"]


def test_managed_a2a_run_resumes_and_its_answer_lands_on_the_task(entries) -> None:
    agent = helper_agent(entries.sim_url)

    def start() -> str:
        return enqueue(
            DoorDeps.of(entries.services),
            NewRun(
                agent="helper",
                user_input="look at T-3",
                model=agent["model"],
                tools=agent["tools"],
                entry_kind="a2a",
                channel="a2a",
                request_key="a2a:task-1",
                link=a2a_link("task-1"),
            ),
        )[0]

    run_id = entries.kill_then_resume("after_checkpoint:kill", start)
    view = entries.wait(run_id)
    assert view.status == "succeeded" and view.lost_count == 1
    task = entries.rows("SELECT status, answer, run_id FROM a2a_tasks WHERE id = 'task-1'")[0]
    assert (task.status, task.answer, task.run_id) == ("completed", ANSWER, run_id)
    assert _assistant_lines(entries, run_id) == [ANSWER]


def test_cron_run_is_one_per_slot_and_its_outcome_is_recorded_once(entries) -> None:
    now = datetime.now(tz=UTC)
    first, created = fire_cron(entries.services, "tick", now)
    again, created_again = fire_cron(entries.services, "tick", now)  # a second beat
    assert first == again and created and not created_again
    entries.worker("victim", fault="after_checkpoint:kill")
    entries.fault_hit("victim")
    entries.worker("survivor")
    entries.beat()
    view = entries.wait(first)
    assert view.status == "succeeded" and view.lost_count == 1
    rows = entries.rows("SELECT run_id, status, outcome, recorded_at FROM cron_runs")
    assert [(r.run_id, r.status, r.outcome) for r in rows] == [(first, "succeeded", ANSWER)]
    resumed = entries.rows(
        "SELECT detail FROM audit_events WHERE run_id = :r AND kind = 'agent.run.crash_resumed'",
        r=first,
    )
    assert resumed[0].detail["calls"][0]["settled"] == "made"  # adopted the checkpoint


def test_two_beats_fire_each_cron_slot_once(entries, tmp_path) -> None:
    entries.reconfigure(
        agents_file=write_catalog(tmp_path / "fast.json", entries.sim_url, cron_every_s=2)
    )
    entries.worker("w1")
    entries.beat("beat1")
    entries.beat("beat2")
    deadline = time.monotonic() + 60

    def fired() -> int:
        return sum(p.output().count("liyagent.cron_fire") for p in entries.procs[1:])

    # Until three slots are done and both beats have fired some slot (on a loaded machine one
    # beat may start a slot or two after the other).
    while (
        entries.rows("SELECT count(*) AS n FROM cron_runs WHERE status = 'succeeded'")[0].n < 3
        or fired() <= entries.rows("SELECT count(*) AS n FROM cron_runs")[0].n
    ):
        assert time.monotonic() < deadline, "cron runs did not complete, or one beat never fired"
        time.sleep(0.2)
    [seen] = entries.rows(
        "SELECT (SELECT count(*) FROM cron_runs) AS slots,"
        " (SELECT count(*) FROM runs WHERE entry_kind = 'cron') AS runs"
    )  # one statement, one snapshot
    assert seen.runs == seen.slots  # yet one run per slot


@pytest.mark.parametrize("fault", ["after_answer:kill", "after_reply:kill"])
def test_teams_turn_is_handed_back_and_replied_to_once(entries, fault) -> None:
    def start() -> str:
        _turn(entries, "msg-1", "conv-9")
        [run_id] = intake_teams(entries.services)
        return run_id

    run_id = entries.kill_then_resume(fault, start)
    assert entries.wait(run_id).status == "succeeded"
    inbox = entries.rows("SELECT status, run_id, reply FROM teams_inbox")[0]
    assert (inbox.status, inbox.run_id) == ("replied", run_id)
    replies = _replies(entries, run_id)
    assert len(replies) == 1 and replies[0].conversation == "conv-9"
    assert replies[0].activity["text"] == ANSWER
    assert replies[0].activity["attachments"][0]["content"]["body"][0]["text"] == ANSWER
    assert inbox.reply["replyToId"] == "msg-1"
    # The turn was never run again: every model step was asked once.
    assert set(entries.asked(run_id).values()) == {1}


def test_repeated_teams_message_is_one_turn(entries) -> None:
    for _ in range(2):
        _turn(entries, "msg-2", "c", "hi")
    started = intake_teams(entries.services) + intake_teams(entries.services)
    assert len(started) == 1
    assert entries.rows("SELECT count(*) AS n FROM teams_inbox")[0].n == 1


def test_a_teams_turn_named_by_anything_but_an_entra_id_is_refused(entries) -> None:
    """The inbox takes a turn only with its sender's Entra object id (lower case, as the
    front stores it): a display name, or an id in another form, is refused; nothing stored."""
    for sender in ("Pat Lee", ANN.upper(), f"{{{ANN}}}"):
        turn = TeamsTurn("m-1", "c-1", entries.sim_url, sender, "hi", {"id": "m-1"})
        with pytest.raises(BadRequest, match="Entra object id"):
            receive_teams(entries.services, turn, "helper")
    assert entries.rows("SELECT count(*) AS n FROM teams_inbox")[0].n == 0


@pytest.mark.parametrize("kind", ["webhook", "ticket_event", "copilot"])
def test_trigger_and_copilot_runs_resume_as_any_run(entries, kind) -> None:
    def start() -> str:
        return start_entry(
            entries.services,
            entry_kind=kind,
            agent="helper",
            user_input="go",
            request_key=f"{kind}:evt-1",
            owner="caller",
            channel=kind,
        )[0]

    run_id = entries.kill_then_resume("after_mark:kill", start)
    view = entries.wait(run_id)
    assert view.status == "succeeded" and view.lost_count == 1
    assert _assistant_lines(entries, run_id) == [ANSWER]


def test_flag_false_entry_run_lost_is_failed_interrupted(entries) -> None:
    entries.reconfigure(crash_resume_entries=False)

    def start() -> str:
        return start_entry(
            entries.services,
            entry_kind="webhook",
            agent="helper",
            user_input="go",
            request_key="webhook:e2",
            owner="caller",
            channel="webhook",
        )[0]

    run_id = entries.kill_then_resume("after_mark:kill", start)
    view = entries.wait(run_id)
    assert view.status == "failed" and view.failure_reason.startswith("interrupted")
    assert (
        entries.rows("SELECT step AS s FROM runs WHERE id = :r", r=run_id)[0].s == 0
    )  # not written ahead
    audit = entries.rows(
        "SELECT detail FROM audit_events WHERE run_id = :r AND kind = 'agent.run.failed'", r=run_id
    )[0].detail
    assert audit["resumable"] is False and "not written ahead" in audit["reason"]


def test_flag_false_still_resumes_runs_that_may_wait(entries) -> None:
    entries.reconfigure(crash_resume_entries=False)
    agent = helper_agent(entries.sim_url)

    def start() -> str:
        return enqueue(
            DoorDeps.of(entries.services),
            NewRun(
                agent="helper",
                user_input="go",
                model=agent["model"],
                tools=agent["tools"],
                entry_kind="playground",
            ),
        )[0]

    run_id = entries.kill_then_resume("after_mark:kill", start)
    assert entries.wait(run_id).status == "succeeded"


def test_answer_is_kept_sealed_then_purged(entries) -> None:
    entries.reconfigure(answer_retention_s=0)
    entries.worker("w1")
    run_id = start_entry(
        entries.services,
        entry_kind="webhook",
        agent="helper",
        user_input="go",
        request_key="webhook:p1",
        owner="c",
        channel="webhook",
    )[0]
    assert entries.wait(run_id).answer == ANSWER
    stored = entries.rows("SELECT answer FROM runs WHERE id = :r", r=run_id)[0].answer
    assert stored and ANSWER.encode() not in bytes(stored)  # sealed, not plain text
    with entries.db() as conn:
        assert purge_answers(conn, 0) == 1
    view = entries.client.get(run_id)
    assert view.status == "succeeded" and view.answer is None
    assert (
        entries.rows("SELECT answer_purged_at FROM runs WHERE id = :r", r=run_id)[
            0
        ].answer_purged_at
        is not None
    )
    assert _assistant_lines(entries, run_id) == [ANSWER]  # the transcript keeps what it got


def _teams_turn(entries, message_id: str) -> str:
    _turn(entries, message_id, f"conv-{message_id}")
    [run_id] = intake_teams(entries.services)
    return run_id


def test_a_refused_teams_reply_fails_the_hand_on_with_its_reason(entries) -> None:
    run_id = _teams_turn(entries, "msg-refused")
    entries.fault(run_id, "POST", "/v3/conversations/", 403)
    entries.worker("w1")
    view = entries.wait(run_id)
    assert view.status == "failed" and view.lost_count == 0
    assert "could not be handed on" in view.failure_reason and "403" in view.failure_reason
    inbox = entries.rows("SELECT status FROM teams_inbox WHERE message_id = 'msg-refused'")[0]
    assert inbox.status == "failed"
    codes = entries.rows(
        "SELECT detail->>'code' AS code FROM audit_events WHERE run_id = :r "
        "AND kind = 'agent.run.failed'",
        r=run_id,
    )
    assert [c.code for c in codes] == ["hand_on_refused"]


def test_a_hand_on_that_keeps_failing_is_capped_by_the_loss_limit(entries) -> None:
    run_id = _teams_turn(entries, "msg-down")
    entries.fault(run_id, "POST", "/v3/conversations/", 503, times=100)
    entries.worker("w1")
    entries.beat()
    view = entries.wait(run_id, timeout=90)
    assert view.status == "failed" and view.lost_count == 3
    assert "could not be handed on: lost 3 times" in view.failure_reason
    inbox = entries.rows("SELECT status FROM teams_inbox WHERE message_id = 'msg-down'")[0]
    assert inbox.status == "failed"
    assert set(entries.asked(run_id).values()) == {1}  # the turn itself ran once


def _lose_three_times(entries, start) -> str:
    """Every run-taking worker dies right after its claim: the run is lost past the limit."""
    entries.worker("ops", runs=False)
    entries.beat()
    run_id = start()
    for n in range(3):
        victim = entries.worker(f"victim{n}", fault="after_claim:kill", ops=False)
        entries.fault_hit(f"victim{n}")
        victim.popen.wait(timeout=10)
    view = entries.wait(run_id, timeout=60)
    assert view.status == "failed" and "lost 3 times" in view.failure_reason
    return run_id


def test_a_run_lost_past_the_limit_tells_its_a2a_task(entries) -> None:
    def start() -> str:
        return enqueue(
            DoorDeps.of(entries.services),
            NewRun(
                agent="helper",
                user_input="look at T-3",
                model=helper_agent(entries.sim_url)["model"],
                tools=["ticket.read", "issue.comment"],
                entry_kind="a2a",
                channel="a2a",
                request_key="a2a:task-lost",
                link=a2a_link("task-lost"),
            ),
        )[0]

    _lose_three_times(entries, start)
    task = entries.rows("SELECT status, answer FROM a2a_tasks WHERE id = 'task-lost'")[0]
    assert task.status == "failed" and "lost 3 times" in task.answer


def test_a_run_lost_past_the_limit_tells_its_cron_record(entries) -> None:
    slot = datetime(2002, 2, 2, tzinfo=UTC)
    _lose_three_times(entries, lambda: fire_cron(entries.services, "tick", slot)[0])
    record = entries.rows("SELECT status, outcome, recorded_at FROM cron_runs")[0]
    assert record.status == "failed" and "lost 3 times" in record.outcome
    assert record.recorded_at is not None


def test_a_run_lost_past_the_limit_tells_its_teams_inbox_row(entries) -> None:
    _lose_three_times(entries, lambda: _teams_turn(entries, "msg-lost"))
    inbox = entries.rows("SELECT status FROM teams_inbox WHERE message_id = 'msg-lost'")[0]
    assert inbox.status == "failed"
    assert (
        entries.vendor(
            "SELECT count(*) AS n FROM sim.connector_activities "
            "WHERE conversation = 'conv-msg-lost'"
        )[0].n
        == 0
    )


def test_a_tampered_answer_is_never_handed_on(entries) -> None:
    """A Teams turn stores its answer before the reply leaves the process; a stored answer that
    no longer verifies is never posted: the run fails, audited (I6)."""
    entries.worker("victim", fault="after_answer:kill")
    run_id = _teams_turn(entries, "msg-tampered")
    entries.fault_hit("victim")
    entries.procs[-1].popen.wait(timeout=10)
    entries.rows(
        "UPDATE runs SET answer = set_byte(answer, 30, get_byte(answer, 30) # 1) "
        "WHERE id = :r RETURNING 1",
        r=run_id,
    )
    entries.worker("survivor")
    entries.beat()
    view = entries.wait(run_id)
    assert view.status == "failed" and "answer does not verify" in view.failure_reason
    assert [role for role, _ in entries.client.transcript(run_id)] == ["user", "notice"]
    # Replies go to the Bot Connector: nothing reached it for this turn, by key or conversation.
    assert _replies(entries, run_id) == []
    assert (
        entries.vendor(
            "SELECT count(*) AS n FROM sim.connector_activities "
            "WHERE conversation = 'conv-msg-tampered'"
        )[0].n
        == 0
    )


def _vendor_reads(entries, run_ids: list[str]) -> dict[str, int]:
    rows = entries.vendor(
        "SELECT run_id, count(*) AS n FROM sim.requests WHERE vendor = 'tickets' "
        "AND run_id = ANY(:ids) GROUP BY run_id",
        ids=run_ids,
    )
    return {str(r.run_id): r.n for r in rows}


def test_entry_runs_are_written_ahead_when_the_flag_is_unset(entries, tmp_path) -> None:
    """TICKETIQ_CRASH_RESUME_ENTRIES removed from every process's environment: its default
    (true) writes cron, trigger, co-pilot and Teams runs ahead, each started where it is in a
    deployment (cron and the Teams intake by the ops worker, the rest by the front), and each
    is resumed after the worker running it is SIGKILLed."""
    flag = "TICKETIQ_CRASH_RESUME_ENTRIES"
    entries.unset_env.add(flag)
    assert flag not in entries.env
    agents = write_catalog(
        tmp_path / "slow.json", entries.sim_url, latency_ms=1500, cron_every_s=3600
    )
    entries.reconfigure(agents_file=agents)
    victim = entries.worker("victim", concurrency=5, ops=False)
    entries.worker("ops", runs=False)  # fires the cron trigger and takes the Teams inbox in
    entries.beat()
    front = serve_front(entries, agents)
    started = {
        "webhook": ("/webhooks/helper", {"event_id": "e1", "input": "go"}),
        "ticket_event": (
            "/tickets/T-3/events",
            {"event_id": "e1", "agent": "helper", "type": "updated", "text": "go"},
        ),
        "copilot": (
            "/copilot/turns",
            {"conversation": "c1", "turn_id": "t1", "agent": "helper", "text": "go", "user": "ann"},
        ),
    }
    runs: dict[str, str] = {}
    for kind, (path, body) in started.items():
        answer = httpx.post(f"{front}{path}", json=body, headers=AUTH, timeout=30)
        assert answer.status_code == 202, answer.text
        runs[kind] = answer.json()["run_id"]
    entries.app.send_task(
        "liyagent.cron_fire", args=["tick"], queue=f"{entries.settings.queue}.ops"
    )
    _turn(entries, "msg-unset", "conv-unset")
    deadline = time.monotonic() + 60
    while len(runs) < 5:
        assert time.monotonic() < deadline, f"entry runs never all started: {runs}"
        for r in entries.rows(
            "SELECT id, entry_kind FROM runs WHERE entry_kind IN ('cron', 'teams')"
        ):
            runs[r.entry_kind] = r.id
        time.sleep(0.1)
    ids = list(runs.values())
    # Every run made its first call on the victim (its second model step takes 1.5 s): kill it.
    while len(_vendor_reads(entries, ids)) < 5:
        assert time.monotonic() < deadline, "the victim never had every run in flight"
        time.sleep(0.05)
    victim.kill()
    entries.worker("survivor", concurrency=3, ops=False)
    for kind, run_id in runs.items():
        view = entries.wait(run_id, timeout=90)
        assert (view.status, view.lost_count) == ("succeeded", 1), (kind, view)
    rows = entries.rows(
        "SELECT id, resumable FROM runs WHERE id = ANY(CAST(:ids AS uuid[]))", ids=ids
    )
    assert all(r.resumable for r in rows)
    resumed = entries.rows(
        "SELECT run_id, count(*) AS n FROM audit_events WHERE kind = 'agent.run.crash_resumed' "
        "AND run_id = ANY(CAST(:ids AS uuid[])) GROUP BY run_id",
        ids=ids,
    )
    assert {str(r.run_id): r.n for r in resumed} == dict.fromkeys(ids, 1)
    assert len(_replies(entries, runs["teams"])) == 1
    cron = entries.rows("SELECT status, outcome FROM cron_runs WHERE run_id = :r", r=runs["cron"])
    assert [(c.status, c.outcome) for c in cron] == [("succeeded", ANSWER)]
