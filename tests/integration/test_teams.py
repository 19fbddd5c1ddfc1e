"""Teams through the Bot Framework, against a real `python -m front`: a channel of the test's
own signs each activity with an RSA key whose JWKS it serves on loopback; the front checks the
token, stores the activity in the durable inbox before answering 200, and the worker replies
to the activity at its serviceUrl (the connector simulator), once, across a SIGKILL."""

from __future__ import annotations

import json
import time
import uuid
from urllib.parse import quote

import httpx
import pytest

from liyagent.local.botframework import BotChannel, new_key
from tests.support.catalogs import helper_agent
from tests.support.front import serve_front

pytestmark = pytest.mark.kill
ANSWER = "Answer from helper."
CARD = "application/vnd.microsoft.card.adaptive"


@pytest.fixture
def channel():
    with BotChannel() as bot:
        yield bot


@pytest.fixture
def agents_file(stack, tmp_path) -> str:
    path = tmp_path / "teams-agents.json"
    path.write_text(json.dumps({"agents": {"helper": helper_agent(stack.sim_url)}}))
    stack.reconfigure(agents_file=str(path))
    return str(path)


@pytest.fixture
def front(stack, agents_file, channel):
    url = serve_front(stack, agents_file, channel.env("helper"))
    with httpx.Client(base_url=url, timeout=10) as http:
        yield http


def _activity(stack, channel: BotChannel, text: str = "status of T-3?", **fields):
    conversation = f"a:1{uuid.uuid4().hex};messageid=17"  # Teams ids carry ':' and ';'
    activity = channel.activity(
        conversation=conversation, text=text, service_url=stack.sim_url, activity_id=None
    )
    activity["id"] = f"1{uuid.uuid4().int % 10**12}"
    return {**activity, **fields}


def _counts(stack) -> tuple[int, int]:
    inbox = stack.rows("SELECT count(*) AS n FROM teams_inbox")[0].n
    return inbox, stack.rows("SELECT count(*) AS n FROM runs")[0].n


def _posts(stack, run_id: str):
    return stack.vendor(
        "SELECT conversation, reply_to_id, activity, idem_key FROM sim.connector_activities "
        "WHERE idem_key = :k",
        k=f"lya-teams-reply-{run_id}",
    )


def _run_of(stack, activity, timeout: float = 30) -> str:
    deadline = time.monotonic() + timeout
    while True:
        rows = stack.rows(
            "SELECT run_id FROM teams_inbox WHERE message_id = :m AND run_id IS NOT NULL",
            m=activity["id"],
        )
        if rows:
            return str(rows[0].run_id)
        assert time.monotonic() < deadline, "the activity's turn never started"
        time.sleep(0.1)


@pytest.mark.parametrize("fault", ["after_checkpoint:kill", "after_reply:kill"])
def test_a_turn_survives_a_sigkill_and_is_replied_to_once(stack, front, channel, fault) -> None:
    activity = _activity(stack, channel, text="<at>liyagent</at> status of T-3?")

    def start() -> str:
        answer = channel.post(front, activity)
        assert answer.status_code == 200, answer.text
        assert answer.json()["created"] is True
        return _run_of(stack, activity)

    run_id = stack.kill_then_resume(fault, start)
    view = stack.wait(run_id)
    assert view.status == "succeeded" and view.lost_count == 1
    [inbox] = stack.rows("SELECT status, text, service_url, activity FROM teams_inbox")
    assert (inbox.status, inbox.text, inbox.service_url) == (
        "replied",
        "status of T-3?",
        stack.sim_url,
    )
    assert inbox.activity["id"] == activity["id"]
    [post] = _posts(stack, run_id)
    conversation = activity["conversation"]["id"]
    assert (post.conversation, post.reply_to_id) == (conversation, activity["id"])
    reply = post.activity
    assert reply["type"] == "message" and reply["replyToId"] == activity["id"]
    assert reply["text"] == ANSWER and reply["recipient"] == activity["from"]
    [card] = reply["attachments"]
    assert card["contentType"] == CARD
    assert card["content"]["body"][0]["text"] == ANSWER
    path = f"/v3/conversations/{quote(conversation, safe='')}/activities/{activity['id']}"
    posted = stack.vendor(
        "SELECT path FROM sim.requests WHERE run_id = :r AND method = 'POST' "
        "AND vendor = 'connector'",
        r=run_id,
    )
    assert [p.path for p in posted] == [path]
    assert set(stack.asked(run_id).values()) == {1}  # the turn never ran again


def test_a_repeated_activity_is_one_turn(stack, front, channel) -> None:
    activity = _activity(stack, channel)
    first, again = channel.post(front, activity), channel.post(front, activity)
    assert (first.status_code, again.status_code) == (200, 200)
    assert again.json() == {"inbox_id": first.json()["inbox_id"], "created": False}
    # The same activity id in another conversation is another turn.
    other = {**activity, "conversation": {"id": "a:other"}}
    assert channel.post(front, other).json()["created"] is True
    assert _counts(stack) == (2, 2)
    stack.worker("w1")
    run_id = _run_of(stack, activity)
    assert stack.wait(run_id).status == "succeeded"
    assert len(_posts(stack, run_id)) == 1


def test_bad_tokens_are_refused_with_401_and_nothing_stored(stack, front, channel) -> None:
    activity = _activity(stack, channel)
    url = stack.sim_url
    bad = {
        "bad signature": channel.token(url, key=new_key()),
        "wrong audience": channel.token(url, audience="someone-else"),
        "wrong issuer": channel.token(url, issuer="https://evil.example"),
        "expired": channel.token(url, expires_in_s=-3600),
        "other serviceUrl": channel.token("https://evil.example/"),
        "not a JWT": "garbage",
    }
    for why, token in bad.items():
        answer = channel.post(front, activity, token=token)
        assert answer.status_code == 401, (why, answer.text)
        assert answer.headers["www-authenticate"].startswith("Bearer"), why
    for headers in ({}, {"Authorization": "Basic x"}, {"Authorization": "Bearer"}):
        answer = front.post("/api/messages", json=activity, headers=headers)
        assert answer.status_code == 401, headers
    assert "Traceback" not in answer.text
    assert _counts(stack) == (0, 0)


def test_other_activities_are_acknowledged_and_bad_ones_refused(stack, front, channel) -> None:
    update = _activity(stack, channel, type="conversationUpdate")
    assert channel.post(front, update).status_code == 200
    for broken in (
        _activity(stack, channel, text="   "),
        _activity(stack, channel, serviceUrl="ftp://x"),
        _activity(stack, channel, conversation="c"),
        _activity(stack, channel, id=""),
    ):
        token = channel.token(str(broken["serviceUrl"]))
        assert channel.post(front, broken, token=token).status_code == 400, broken
    assert _counts(stack) == (0, 0)


def test_a_front_without_a_bot_refuses_every_activity(stack, agents_file, channel) -> None:
    url = serve_front(stack, agents_file)
    with httpx.Client(base_url=url, timeout=10) as http:
        answer = channel.post(http, _activity(stack, channel))
    assert answer.status_code == 503 and "LIYAGENT_TEAMS_APP_ID" in answer.json()["error"]
    assert _counts(stack) == (0, 0)
