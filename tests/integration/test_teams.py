"""Teams through the Bot Framework, against a real `python -m front`: a channel of the test's
own signs each activity with an RSA key whose JWKS it serves on loopback; the front checks the
token and the key's endorsements, stores the activity in the durable inbox before answering
200, and the worker replies to the activity at its serviceUrl (the connector simulator), once,
across a SIGKILL, as the bot: with a token from the simulators' token endpoint, which the
connector simulator requires."""

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
def channel(stack, request):
    """The channel and its bot (fields from an indirect parameter); every worker started after
    it replies as the bot."""
    with BotChannel(**getattr(request, "param", {})) as bot:
        stack.extra_env.update(bot.worker_env(stack.sim_url))
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
        "SELECT conversation, reply_to_id, activity, idem_key, app_id, token_id "
        "FROM sim.connector_activities WHERE idem_key = :k ORDER BY id",
        k=f"lya-teams-reply-{run_id}",
    )


def _requests(stack, run_id: str, vendor: str) -> list[tuple[str, int]]:
    """(method, status) of the run's requests to the connector or the token endpoint (login)."""
    rows = stack.vendor(
        "SELECT method, status FROM sim.requests WHERE run_id = :r AND vendor = :v ORDER BY id",
        r=run_id,
        v=vendor,
    )
    return [(r.method, r.status) for r in rows]


def _tokens_issued(stack, channel: BotChannel) -> int:
    return stack.vendor(
        "SELECT count(*) AS n FROM sim.bot_tokens WHERE app_id = :a", a=channel.app_id
    )[0].n


def _turn(stack, front, channel: BotChannel) -> str:
    """Deliver a new activity through the front; its run's id (the run may not have run yet)."""
    activity = _activity(stack, channel)
    answer = channel.post(front, activity)
    assert answer.status_code == 200, answer.text
    return _run_of(stack, activity)


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
    assert post.app_id == channel.app_id  # it carried the bot's token, which the connector checks
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
        _activity(stack, channel, text="hi \ud800"),  # a lone surrogate: not Unicode text
        _activity(stack, channel, serviceUrl="ftp://x"),
        _activity(stack, channel, conversation="c"),
        _activity(stack, channel, id=""),
    ):
        token = channel.token(str(broken["serviceUrl"]))
        assert channel.post(front, broken, token=token).status_code == 400, broken
    assert _counts(stack) == (0, 0)


def test_a_front_without_a_bot_refuses_every_activity(stack, agents_file, channel) -> None:
    url = serve_front(stack, agents_file, {"LIYAGENT_TEAMS_APP_ID": ""})
    with httpx.Client(base_url=url, timeout=10) as http:
        answer = channel.post(http, _activity(stack, channel))
    assert answer.status_code == 503 and "LIYAGENT_TEAMS_APP_ID" in answer.json()["error"]
    assert _counts(stack) == (0, 0)


def test_the_bot_token_is_kept_and_a_refused_one_is_replaced_once(stack, front, channel) -> None:
    stack.worker("w1", concurrency=1)  # one process: one token cache
    first, second = (_turn(stack, front, channel) for _ in range(2))
    for run_id in (first, second):
        assert stack.wait(run_id).status == "succeeded"
    [one], [two] = _posts(stack, first), _posts(stack, second)
    assert one.app_id == two.app_id == channel.app_id
    assert one.token_id == two.token_id and _tokens_issued(stack, channel) == 1
    assert _requests(stack, second, "login") == []
    # The tenant stops honouring the token: the next reply's read-back is refused (401), a new
    # token is fetched once, and the reply is read back and posted once with it.
    assert httpx.post(f"{stack.sim_url}/sim/bots/{channel.app_id}/revoke").json()["expired"] == 1
    third = _turn(stack, front, channel)
    assert stack.wait(third).status == "succeeded"
    assert _requests(stack, third, "connector") == [("GET", 401), ("GET", 200), ("POST", 201)]
    assert _requests(stack, third, "login") == [("POST", 200)]
    [post] = _posts(stack, third)
    assert post.app_id == channel.app_id and post.token_id != one.token_id


@pytest.mark.parametrize("channel", [{"token_ttl_s": 2}], indirect=True)
def test_an_expired_cached_token_is_replaced_before_it_is_sent(stack, front, channel) -> None:
    stack.worker("w1", concurrency=1)
    first = _turn(stack, front, channel)
    assert stack.wait(first).status == "succeeded"
    deadline = time.monotonic() + 15
    while stack.vendor(
        "SELECT count(*) AS n FROM sim.bot_tokens WHERE app_id = :a "
        "AND expires_at > clock_timestamp()",
        a=channel.app_id,
    )[0].n:
        assert time.monotonic() < deadline, "the bot's 2 s tokens never expired"
        time.sleep(0.2)
    second = _turn(stack, front, channel)
    assert stack.wait(second).status == "succeeded"
    # The worker saw its cached token expire and fetched a new one: never refused.
    calls = _requests(stack, second, "connector")
    assert ("GET", 401) not in calls and ("POST", 401) not in calls
    assert calls[-1] == ("POST", 201)
    assert ("POST", 200) in _requests(stack, second, "login")
    [one], [two] = _posts(stack, first), _posts(stack, second)
    assert two.token_id != one.token_id


def test_a_token_refused_twice_fails_the_hand_on_after_one_refresh(stack, front, channel) -> None:
    run_id = _turn(stack, front, channel)
    stack.fault(run_id, "POST", "/v3/conversations/", 401, times=2)
    stack.worker("w1")
    view = stack.wait(run_id)
    assert view.status == "failed" and "refused the bot's token twice" in view.failure_reason
    calls = _requests(stack, run_id, "connector")
    assert calls == [("GET", 200), ("POST", 401), ("POST", 401)]
    assert _requests(stack, run_id, "login") == [("POST", 200), ("POST", 200)]  # one refresh
    assert _posts(stack, run_id) == []


def test_a_token_endpoint_down_leaves_the_reply_to_a_later_attempt(stack, front, channel) -> None:
    run_id = _turn(stack, front, channel)
    stack.fault(run_id, "POST", "/botframework.com/oauth2/", 503)
    stack.worker("w1")
    stack.beat()
    view = stack.wait(run_id)
    assert view.status == "succeeded" and view.lost_count == 1
    assert _requests(stack, run_id, "login") == [("POST", 503), ("POST", 200)]
    [post] = _posts(stack, run_id)
    assert post.app_id == channel.app_id and post.activity["text"] == ANSWER
    errors = stack.rows(
        "SELECT detail->>'error' AS error FROM audit_events WHERE run_id = :r "
        "AND kind = 'agent.run.error'",
        r=run_id,
    )
    # What ended the attempt, by type only (its message may carry user text, so it is never
    # recorded): the reply left in doubt by the token endpoint.
    assert [e.error.split(":")[0] for e in errors] == ["ToolInDoubt"]
    assert set(stack.asked(run_id).values()) == {1}  # the turn itself ran once


def test_read_back_off_posts_without_looking(stack, front, channel) -> None:
    stack.worker("w1", env={"LIYAGENT_TEAMS_READ_BACK": "off"})
    run_id = _turn(stack, front, channel)
    assert stack.wait(run_id).status == "succeeded"
    assert _requests(stack, run_id, "connector") == [("POST", 201)]
    assert len(_posts(stack, run_id)) == 1


def test_read_back_on_against_a_connector_that_cannot_list_names_the_setting(
    stack, front, channel
) -> None:
    run_id = _turn(stack, front, channel)
    stack.fault(run_id, "GET", "/v3/conversations/", 405)
    stack.worker("w1")
    view = stack.wait(run_id)
    assert view.status == "failed" and "LIYAGENT_TEAMS_READ_BACK=off" in view.failure_reason
    assert _requests(stack, run_id, "connector") == [("GET", 405)]  # never posted unverified
    assert _posts(stack, run_id) == []


@pytest.mark.parametrize("channel", [{"endorsements": ("webchat",)}], indirect=True)
def test_a_key_not_endorsed_for_the_channel_is_refused(stack, front, channel) -> None:
    msteams = _activity(stack, channel)
    refused = channel.post(front, msteams)
    assert refused.status_code == 401 and "not endorsed" in refused.json()["error"]
    assert refused.headers["www-authenticate"].startswith("Bearer")
    nameless = {k: v for k, v in _activity(stack, channel).items() if k != "channelId"}
    assert channel.post(front, nameless).status_code == 401
    assert _counts(stack) == (0, 0)
    # The key endorses webchat: an activity from that channel is taken.
    webchat = _activity(stack, channel, channelId="webchat")
    assert channel.post(front, webchat).status_code == 200
    assert _counts(stack) == (1, 1)
