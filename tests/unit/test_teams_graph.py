"""Where a Teams reply is read back in Microsoft Graph, and which message is the reply (pure)."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest

from runtime.base.settings import Settings
from runtime.entries.teams import _is_ours, place_of
from runtime.toolbox.tools import ToolError

APP = "11111111-2222-3333-4444-555555555555"
USER = "aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee"
TENANT = "t-1"
SETTINGS = Settings(teams_app_id=APP)
GRAPH = "https://graph.microsoft.com/v1.0"


def _activity(conversation: str, kind: str | None, **data: object) -> dict[str, object]:
    return {
        "conversation": {"id": conversation, "conversationType": kind, "tenantId": TENANT},
        "from": {"id": "29:x", "aadObjectId": USER},
        "channelData": data,
    }


def test_a_personal_chat_is_the_chat_of_the_person_and_the_bot() -> None:
    since = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
    place = place_of(SETTINGS, _activity("a:1xyz", "personal"), since)
    chat = f"19%3A{USER}_{APP}%40unq.gbl.spaces"
    assert place.url == f"{GRAPH}/chats/{chat}/messages"
    assert place.tenant == TENANT
    # From shortly before the answer was stored, on the one time Graph filters from below.
    assert place.params == {
        "$top": "50",
        "$orderby": "lastModifiedDateTime desc",
        "$filter": "lastModifiedDateTime gt 2026-01-02T02:59:05.000Z",
    }


def test_a_group_chat_is_itself_and_a_channel_thread_its_roots_replies() -> None:
    group = place_of(SETTINGS, _activity("19:abc@thread.v2", "groupChat"), None)
    assert group.url == f"{GRAPH}/chats/19%3Aabc%40thread.v2/messages"
    assert "$filter" not in group.params
    thread = place_of(
        SETTINGS,
        _activity(
            "19:c@thread.tacv2;messageid=17",
            "channel",
            team={"id": "19:c@thread.tacv2", "aadGroupId": "team-1"},
            channel={"id": "19:c@thread.tacv2"},
        ),
        None,
    )
    assert thread.url == f"{GRAPH}/teams/team-1/channels/19%3Ac%40thread.tacv2/messages/17/replies"
    assert thread.params == {"$top": "50"}  # the only option Graph takes there
    assert "ChannelMessage.Read" in thread.permission


@pytest.mark.parametrize(
    ("activity", "named"),
    [
        ({"conversation": {"id": "a:1", "conversationType": "personal"}}, "tenant"),
        (
            {"conversation": {"id": "a:1", "conversationType": "personal", "tenantId": TENANT}},
            "aadObjectId",
        ),
        (_activity("19:c@thread.tacv2;messageid=17", "channel"), "aadGroupId"),
    ],
)
def test_what_the_activity_lacks_is_named_and_the_setting_too(activity, named) -> None:
    with pytest.raises(ToolError) as refused:
        place_of(SETTINGS, activity, None)
    assert named in str(refused.value) and "LIYAGENT_TEAMS_READ_BACK=off" in str(refused.value)


def _message(app: str, card: object, content_type: str = "application/vnd.microsoft.card.adaptive"):
    return {
        "from": {"user": None, "application": {"id": app}},
        "attachments": [{"contentType": content_type, "content": json.dumps(card)}],
    }


def test_the_reply_is_this_bots_message_whose_card_carries_the_key() -> None:
    card = {"type": "AdaptiveCard", "body": [{"type": "TextBlock", "id": "k-1", "text": "hi"}]}
    assert _is_ours(_message(APP, card), APP, "k-1")
    assert not _is_ours(_message(APP, card), APP, "k-2")  # another run's reply
    assert not _is_ours(_message("other-app", card), APP, "k-1")  # another bot's
    assert not _is_ours(_message(APP, card, "text/html"), APP, "k-1")  # not a card
    person = {"from": {"user": {"id": USER}, "application": None}, "attachments": []}
    assert not _is_ours(person, APP, "k-1")
    adaptive = "application/vnd.microsoft.card.adaptive"
    broken = {**_message(APP, card), "attachments": [{"contentType": adaptive, "content": "{"}]}
    assert not _is_ours(broken, APP, "k-1")
