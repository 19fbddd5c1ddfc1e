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

from liyagent.local.botframework import BotChannel, TeamsUser, new_key
from store.gates import set_principal
from tests.integration.cli.test_cli import cli
from tests.support.catalogs import helper_agent
from tests.support.front import serve_front
from tests.support.recorded import recorded_servers

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


def _activity(
    stack,
    channel: BotChannel,
    text: str = "status of T-3?",
    kind: str = "personal",
    sender: TeamsUser | None = None,
    **fields,
):
    """A new activity from `sender` (the channel's user by default) in a new conversation of
    `kind`, with ids shaped as Teams's: a personal chat `a:1...`, a group chat
    `19:...@thread.v2`, a channel thread `19:...;messageid=R` (the bot installed in its team, the
    channel made known to the simulators' Graph; for a personal chat, the bot's app installed for
    the sender, as it is when someone can message it)."""
    activity_id = f"1{uuid.uuid4().int % 10**12}"
    conversation = {
        "personal": f"a:1{uuid.uuid4().hex}",
        "groupChat": f"19:{uuid.uuid4().hex}@thread.v2",
        "channel": f"19:{uuid.uuid4().hex}@thread.tacv2;messageid={activity_id}",
    }[kind]
    if kind == "channel":
        channel.register_channel(stack.sim_url, conversation.partition(";")[0])
    if kind == "personal":
        channel.install_personal(stack.sim_url, conversation, sender)
    activity = channel.activity(
        conversation=conversation,
        text=text,
        service_url=stack.sim_url,
        activity_id=activity_id,
        conversation_type=kind,
        sender=sender,
    )
    return {**activity, **fields}


def _counts(stack) -> tuple[int, int]:
    inbox = stack.rows("SELECT count(*) AS n FROM teams_inbox")[0].n
    return inbox, stack.rows("SELECT count(*) AS n FROM runs")[0].n


def _posts(stack, run_id: str):
    return stack.vendor(
        "SELECT id, conversation, reply_to_id, activity, idem_key, app_id, token_id "
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


@pytest.mark.parametrize(
    ("fault", "kind", "reads"),
    [
        # Killed before its answer: the resumed turn answers and posts at once, unread.
        ("after_checkpoint:kill", "personal", "none"),
        # Killed between the post and its record: the resume finds the reply through
        # Microsoft Graph (the connector lists nothing) and does not post it again.
        ("after_reply:kill", "personal", "found"),
        ("after_reply:kill", "groupChat", "found"),
        ("after_reply:kill", "channel", "found"),
        # Killed after the answer was stored, before the post: the resume reads until Graph's
        # lag bound has passed, finds nothing, and posts once.
        ("after_answer:kill", "personal", "settled"),
    ],
)
def test_a_turn_survives_a_sigkill_and_is_replied_to_once(
    stack, front, channel, fault, kind, reads
) -> None:
    activity = _activity(stack, channel, text="<at>liyagent</at> status of T-3?", kind=kind)

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
    # The card carries the run's key, which is how Graph's read-back knows the reply.
    assert card["content"]["body"][0] == {
        "type": "TextBlock",
        "id": f"lya-teams-reply-{run_id}",
        "text": ANSWER,
        "wrap": True,
    }
    path = f"/v3/conversations/{quote(conversation, safe='')}/activities/{activity['id']}"
    posted = stack.vendor(
        "SELECT path FROM sim.requests WHERE run_id = :r AND method = 'POST' "
        "AND vendor = 'connector'",
        r=run_id,
    )
    assert [p.path for p in posted] == [path]
    reads_made = _reads(stack, run_id)
    if reads == "none":
        assert reads_made == []
    else:
        # The ids Graph names the conversation by, asked of the calls documented for them (a
        # message activity carries neither a team's group id nor a personal chat's Graph id),
        # then the conversation listed where Graph shows it.
        lookups, listing = _read_back_calls(stack, channel, activity, kind)
        assert reads_made[: len(lookups)] == lookups
        listed = reads_made[len(lookups) :]
        if reads == "found":
            assert listed == [listing]
            [found] = stack.rows("SELECT reply FROM teams_inbox")
            assert found.reply["found_in"] == "graph" and found.reply["id"] == str(post.id)
        else:
            assert len(listed) >= 2 and set(listed) == {listing}
    assert set(stack.asked(run_id).values()) == {1}  # the turn never ran again


def _reads(stack, run_id: str) -> list[tuple[str, str, int]]:
    """(vendor, path without its query, status) of the run's GETs to the connector and Graph,
    in order."""
    rows = stack.vendor(
        "SELECT vendor, path, status FROM sim.requests WHERE run_id = :r AND method = 'GET' "
        "AND vendor IN ('connector', 'graph') ORDER BY id",
        r=run_id,
    )
    return [(r.vendor, r.path.partition("?")[0], r.status) for r in rows]


def _read_back_calls(stack, channel: BotChannel, activity, kind: str):
    """The lookups a read-back of `activity` makes first, and the listing it then reads, as
    `_reads` has them; the ids from the simulators' own records."""
    conversation = activity["conversation"]["id"]
    if kind == "personal":
        user = activity["from"]["aadObjectId"]
        [install] = stack.vendor(
            "SELECT i.id, i.chat_id FROM sim.personal_installs i "
            "JOIN sim.teams_apps a ON a.id = i.teams_app_id "
            "WHERE i.user_id = :u AND a.bot_id = :b",
            u=user,
            b=channel.app_id,
        )
        apps = f"/v1.0/users/{user}/teamwork/installedApps"
        lookups = [
            ("graph", apps, 200),
            ("graph", f"{apps}/{quote(install.id, safe='')}/chat", 200),
        ]
        return lookups, ("graph", f"/v1.0/chats/{quote(install.chat_id, safe='')}/messages", 200)
    if kind == "channel":
        base, _, root = conversation.partition(";messageid=")
        lookups = [("connector", f"/v3/teams/{quote(channel.team_thread_id, safe='')}", 200)]
        replies = f"/v1.0/teams/{channel.team_id}/channels/{quote(base, safe='')}"
        return lookups, ("graph", f"{replies}/messages/{root}/replies", 200)
    return [], ("graph", f"/v1.0/chats/{quote(conversation, safe='')}/messages", 200)


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


def test_a_message_without_the_senders_entra_id_is_refused(stack, front, channel) -> None:
    """A run is owned by its sender's Entra object id: a message that names the sender by
    display name and channel id only (or by something that is no Entra id) is refused with
    400, saying which id is missing, and nothing is stored."""
    for sender in (
        {"id": "29:1pat", "name": "Pat Lee"},
        {"id": "29:1pat", "name": "Pat Lee", "aadObjectId": "Pat Lee"},
        {"id": "29:1pat", "name": "Pat Lee", "aadObjectId": ""},
    ):
        answer = channel.post(front, _activity(stack, channel, **{"from": sender}))
        assert answer.status_code == 400, sender
        assert "from.aadObjectId" in answer.json()["error"], answer.text
    assert _counts(stack) == (0, 0)


def _turn_of(stack, front, channel: BotChannel, sender: TeamsUser, text: str) -> str:
    """`sender`'s turn, through the front; its run's id."""
    activity = _activity(stack, channel, text=text, sender=sender)
    answer = channel.post(front, activity)
    assert answer.status_code == 200, answer.text
    return _run_of(stack, activity)


def _inbox_row(stack, run_id: str):
    return stack.rows(
        "SELECT i.status, i.text, i.activity, i::text AS whole FROM teams_inbox i "
        "WHERE run_id = :r",
        r=run_id,
    )[0]


def test_namesakes_are_two_owners_and_erasing_one_leaves_the_other(stack, front, channel):
    """Two people named Pat Lee are two owners, by their Entra object ids: erasing one's runs
    by owner leaves the other's, and leaves no trace of the erased one's display name (content,
    not identity). Erasing by the display name finds nobody and says which id to give."""
    stack.worker("w1")
    pat, namesake = TeamsUser("Pat Lee"), TeamsUser("Pat Lee")
    secret = uuid.uuid4().hex[:10]
    mine = _turn_of(stack, front, channel, pat, f"mine-{secret}")
    theirs = _turn_of(stack, front, channel, namesake, f"theirs-{secret}")
    for run_id in (mine, theirs):
        assert stack.wait(run_id).status == "succeeded"
    owners = {r.id: r.owner for r in stack.rows("SELECT id::text AS id, owner FROM runs")}
    assert owners == {mine: pat.aad_object_id, theirs: namesake.aad_object_id}

    by_name = cli("erase", "--owner", "Pat Lee", "--by", "dpo", env=stack.env)
    assert by_name.returncode == 2 and "Entra object id" in by_name.stderr, by_name.stderr
    done = cli("erase", "--owner", pat.aad_object_id, "--by", "dpo", env=stack.env)
    assert done.returncode == 0, done.stderr
    assert mine in done.stdout and theirs not in done.stdout

    erased = _inbox_row(stack, mine)
    assert (erased.text, erased.activity) == ("", None)
    assert "Pat Lee" not in erased.whole and secret not in erased.whole
    [run] = stack.rows("SELECT input, owner FROM runs WHERE id = :r", r=mine)
    assert (run.input, run.owner) == ("", pat.aad_object_id)  # the tombstone keeps the id
    kept = _inbox_row(stack, theirs)
    assert kept.text == f"theirs-{secret}" and kept.activity["from"]["name"] == "Pat Lee"
    assert stack.rows("SELECT input FROM runs WHERE id = :r", r=theirs)[0].input == kept.text


def test_a_revoked_person_is_refused_by_id_and_a_namesake_is_not(stack, front, channel):
    """A revocation names the person by their Entra object id: their turn is refused even
    after they renamed themselves, and nothing is posted; another person with the display
    name they had is answered."""
    pat = TeamsUser("Pat Lee")
    with stack.db() as conn:
        set_principal(
            conn, pat.aad_object_id, may_run=False, may_act=True, reason="left the company"
        )
    namesake = _turn_of(stack, front, channel, TeamsUser("Pat Lee"), "status of T-3?")
    renamed = _turn_of(stack, front, channel, pat.renamed("Pat Lee-Smith"), "status of T-3?")
    stack.worker("w1")

    assert stack.wait(namesake).status == "succeeded"
    assert len(_posts(stack, namesake)) == 1
    refused = stack.wait(renamed)
    assert refused.status == "failed", refused
    assert f"its owner {pat.aad_object_id} may no longer run it" in refused.failure_reason
    assert _posts(stack, renamed) == [] and _inbox_row(stack, renamed).status == "failed"
    assert stack.asked(renamed) == {}  # the model was never asked


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
    # The tenant stops honouring the token: the next reply is refused (401) with no effect, a
    # new token is fetched once, and the reply is posted once with it. A first hand-on reads
    # nothing back: no attempt before it posted.
    assert httpx.post(f"{stack.sim_url}/sim/bots/{channel.app_id}/revoke").json()["expired"] == 1
    third = _turn(stack, front, channel)
    assert stack.wait(third).status == "succeeded"
    assert _requests(stack, third, "connector") == [("POST", 401), ("POST", 201)]
    assert _requests(stack, third, "login") == [("POST", 200)]
    assert _requests(stack, third, "graph") == []
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
    assert calls == [("POST", 401), ("POST", 401)]
    assert _requests(stack, run_id, "login") == [("POST", 200), ("POST", 200)]  # one refresh
    assert _posts(stack, run_id) == []


def test_a_token_endpoint_down_leaves_the_reply_to_a_later_attempt(stack, front, channel) -> None:
    run_id = _turn(stack, front, channel)
    stack.fault(run_id, "POST", "/botframework.com/oauth2/", 503)
    stack.worker("w1")
    stack.beat()
    view = stack.wait(run_id)
    assert view.status == "succeeded" and view.lost_count == 1
    # The resume reads Graph first (its own token, from the tenant's endpoint), then posts.
    tokens = stack.vendor(
        "SELECT path, status FROM sim.requests WHERE run_id = :r AND vendor = 'login' ORDER BY id",
        r=run_id,
    )
    graph_token = f"/login.microsoftonline.com/{channel.tenant_id}/oauth2/v2.0/token"
    bot_token = "/botframework.com/oauth2/v2.0/token"
    assert [(t.path, t.status) for t in tokens] == [
        (bot_token, 503),
        (graph_token, 200),
        (bot_token, 200),
    ]
    assert set(_requests(stack, run_id, "graph")) == {("GET", 200)}
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


def test_read_back_off_posts_twice_after_a_crash_between_post_and_record(
    stack, front, channel
) -> None:
    """What `LIYAGENT_TEAMS_READ_BACK=off` leaves open, shown: the resume posts unread."""
    stack.extra_env["LIYAGENT_TEAMS_READ_BACK"] = "off"
    activity = _activity(stack, channel)

    def start() -> str:
        assert channel.post(front, activity).status_code == 200
        return _run_of(stack, activity)

    run_id = stack.kill_then_resume("after_reply:kill", start)
    assert stack.wait(run_id).status == "succeeded"
    assert _requests(stack, run_id, "graph") == []
    assert len(_posts(stack, run_id)) == 2


def test_a_graph_that_refuses_the_read_back_fails_the_hand_on_unposted(
    stack, front, channel
) -> None:
    run_id = _turn(stack, front, channel)
    # The first post is lost before it takes effect (503): the reply is in doubt, and the
    # resume must read back; Graph refuses the bot (no consent): nothing is posted unverified.
    stack.fault(run_id, "POST", "/v3/conversations/", 503)
    stack.fault(run_id, "GET", "/v1.0/chats/", 403)
    stack.worker("w1")
    stack.beat()
    view = stack.wait(run_id)
    assert view.status == "failed", view
    assert "ChatMessage.Read.Chat" in view.failure_reason
    assert "LIYAGENT_TEAMS_READ_BACK=off" in view.failure_reason
    # The personal chat's id was found (the installation, its chat), then its listing refused.
    assert _requests(stack, run_id, "graph") == [("GET", 200), ("GET", 200), ("GET", 403)]
    assert _requests(stack, run_id, "connector") == [("POST", 503)]
    assert _posts(stack, run_id) == []


def test_a_post_graph_shows_late_is_found_within_the_settle_bound(stack, front, channel) -> None:
    """Graph shows the lost attempt's post 16 s after it was made, later than the resume's
    first read (a new worker takes over within a few seconds, ten on a loaded machine): the
    resume keeps reading until its bound (22 s) has passed, finds the post, and posts nothing."""
    stack.extra_env["LIYAGENT_TEAMS_GRAPH_SETTLE_MS"] = "22000"
    httpx.post(f"{stack.sim_url}/sim/graph", json={"lag_ms": 16000}).raise_for_status()
    activity = _activity(stack, channel)

    def start() -> str:
        assert channel.post(front, activity).status_code == 200
        return _run_of(stack, activity)

    try:
        run_id = stack.kill_then_resume("after_reply:kill", start)
        assert stack.wait(run_id).status == "succeeded"
    finally:
        httpx.post(f"{stack.sim_url}/sim/graph", json={"lag_ms": 0}).raise_for_status()
    [post] = stack.vendor(
        "SELECT visible_at FROM sim.connector_activities WHERE idem_key = :k",
        k=f"lya-teams-reply-{run_id}",
    )
    reads = stack.vendor(
        "SELECT created_at, status FROM sim.requests WHERE run_id = :r AND vendor = 'graph' "
        "ORDER BY id",
        r=run_id,
    )
    assert {r.status for r in reads} == {200}
    assert reads[0].created_at < post.visible_at, "the resume first read after Graph showed it"
    assert reads[-1].created_at >= post.visible_at  # read on past the first empty answer


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


def test_a_reply_target_moved_in_the_database_gets_no_reply_and_no_token(
    stack, front, channel, tmp_path
) -> None:
    """The reply carries the bot's token to the turn's serviceUrl. A database writer who points
    a queued turn's inbox row at another host gets nothing there: the worker posts only where
    the run's sealed definition says the turn came from, and fails the hand-on otherwise."""
    with recorded_servers(tmp_path) as serve:
        elsewhere = serve()
        run_id = _turn(stack, front, channel)  # no worker yet: the run waits in its queue
        stack.rows(
            "UPDATE teams_inbox SET service_url = :u WHERE run_id = :r RETURNING 1",
            u=elsewhere.base_url,
            r=run_id,
        )
        stack.worker("w1")
        view = stack.wait(run_id)
        assert view.status == "failed", view
        assert "its Teams turn's service_url differs from the one sealed" in (
            view.failure_reason or ""
        )
        assert elsewhere.received == []  # no reply, and no bot token, went there
    assert _posts(stack, run_id) == []
