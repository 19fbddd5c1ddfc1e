"""The Graph ids a resumed Teams hand-on reads back by, asked of the calls Microsoft documents
for them (a message activity carries neither): a channel's team group id from the Bot
Connector's team details, a personal chat's id from Graph's installation of the app for the
person. Each turn here is resumed the same way: its first post is lost before it takes effect
(503), which leaves the reply in doubt, so the next attempt must read back before it posts.
Judged from Postgres and the simulators' records, with real front, workers and beat."""

# The Teams fixtures come from test_teams.py; each test names them as its parameters.
# ruff: noqa: F811

from __future__ import annotations

import pytest

from liyagent.local.botframework import BotChannel
from tests.integration.entries.test_teams import (  # noqa: F401 (fixtures)
    _activity,
    _posts,
    _requests,
    _run_of,
    agents_file,
    channel,
    front,
)

pytestmark = pytest.mark.kill
APPS = "/v1.0/users/"
TEAMS = "/v3/teams/"


def _in_doubt_turn(stack, front, channel: BotChannel, kind: str = "personal", **fields) -> str:
    """A turn of `kind` whose first post is lost before it lands: its run's id."""
    activity = _activity(stack, channel, kind=kind, **fields)
    assert channel.post(front, activity).status_code == 200
    run_id = _run_of(stack, activity)
    stack.fault(run_id, "POST", "/v3/conversations/", 503)
    return run_id


def _gets(stack, run_id: str, prefix: str) -> list[int]:
    """The statuses of the run's GETs whose path starts with `prefix`, in order."""
    rows = stack.vendor(
        "SELECT status FROM sim.requests WHERE run_id = :r AND method = 'GET' "
        "AND starts_with(path, :p) ORDER BY id",
        r=run_id,
        p=prefix,
    )
    return [r.status for r in rows]


def test_graph_refusing_the_personal_chat_names_the_permission(stack, front, channel) -> None:
    """Graph refuses to tell the bot's chat with the person (no consent for the app's
    installations): the hand-on fails unposted, naming the permission to grant."""
    run_id = _in_doubt_turn(stack, front, channel)
    stack.fault(run_id, "GET", APPS, 403)
    stack.worker("w1")
    stack.beat()
    view = stack.wait(run_id)
    assert view.status == "failed", view
    assert "TeamsAppInstallation.ReadForUser.All" in view.failure_reason
    assert "LIYAGENT_TEAMS_READ_BACK=off" in view.failure_reason
    assert _requests(stack, run_id, "graph") == [("GET", 403)]  # refused: not tried again
    assert _requests(stack, run_id, "connector") == [("POST", 503)]
    assert _posts(stack, run_id) == []


def test_a_team_the_connector_does_not_show_the_bot_fails_unposted(stack, front, channel) -> None:
    """The bot is no longer in the message's team (the Bot Connector answers its team details
    404): the hand-on fails naming the team and what to do, and Graph is never asked."""
    gone = "19:0123456789abcdef0123456789abcdef@thread.tacv2"
    activity_data = {
        "tenant": {"id": channel.tenant_id},
        "team": {"id": gone},
        "channel": {"id": gone},
    }
    run_id = _in_doubt_turn(stack, front, channel, kind="channel", channelData=activity_data)
    stack.worker("w1")
    stack.beat()
    view = stack.wait(run_id)
    assert view.status == "failed", view
    assert f"the Bot Connector refused to show team {gone}" in view.failure_reason
    assert "install the bot's app in the team" in view.failure_reason
    assert _requests(stack, run_id, "connector") == [("POST", 503), ("GET", 404)]
    assert _requests(stack, run_id, "graph") == [] and _posts(stack, run_id) == []


@pytest.mark.parametrize(("kind", "lookup"), [("personal", APPS), ("channel", TEAMS)])
def test_a_lookup_answered_503_is_tried_again_in_place(stack, front, channel, kind, lookup):
    """A lookup the service cannot answer for a moment (503, then an answer) is sent again by
    the same attempt: the reply is read back and posted once, no loss charged for it."""
    run_id = _in_doubt_turn(stack, front, channel, kind=kind)
    stack.fault(run_id, "GET", lookup, 503)
    stack.worker("w1")
    stack.beat()
    view = stack.wait(run_id)
    assert view.status == "succeeded", view
    assert view.lost_count == 1  # the lost post only
    assert _gets(stack, run_id, lookup)[:2] == [503, 200]
    assert len(_posts(stack, run_id)) == 1


def test_the_ids_are_asked_once_per_process(stack, front, channel) -> None:
    """Two resumed turns of one person, and two in one team, in one worker process: the
    person's chat and the team's group id are asked for once each (they never change), and
    every reply is posted once."""
    kinds = ("personal", "personal", "channel", "channel")
    runs = [_in_doubt_turn(stack, front, channel, kind=kind) for kind in kinds]
    stack.worker("w1", concurrency=1)  # one process: one memory of ids
    stack.beat()
    assert [stack.wait(r).status for r in runs] == ["succeeded"] * 4
    gets = {prefix: sum(len(_gets(stack, r, prefix)) for r in runs) for prefix in (APPS, TEAMS)}
    # The installation (found by the manifest id at the first filter) and its chat; the team.
    assert gets == {APPS: 2, TEAMS: 1}
    assert [len(_posts(stack, r)) for r in runs] == [1, 1, 1, 1]
