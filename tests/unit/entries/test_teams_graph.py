"""Where a Teams reply is read back in Microsoft Graph, and which message is the reply (pure):
what a stored activity says of its conversation, the Graph collections once the ids a message
activity lacks are known (they are asked of Microsoft: tests/integration/entries/test_teams.py)."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest

from runtime.entries.teams.graph import Conversation, chat_place, is_ours, thread_place
from runtime.entries.teams.ids import manifest_id
from runtime.entries.teams.settings import TeamsSettings
from runtime.toolbox.tools import ToolError

APP = "11111111-2222-3333-4444-555555555555"
USER = "aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee"
TENANT = "t-1"
SETTINGS = TeamsSettings(app_id=APP)
GRAPH = "https://graph.microsoft.com/v1.0"


def _activity(conversation: str, kind: str | None, **data: object) -> dict[str, object]:
    return {
        "conversation": {"id": conversation, "conversationType": kind, "tenantId": TENANT},
        "from": {"id": "29:x", "aadObjectId": USER},
        "channelData": data,
    }


def test_a_personal_chat_is_found_by_its_sender_never_formed_from_ids() -> None:
    conv = Conversation.of(_activity("a:1xyz", "personal"))
    assert (conv.kind, conv.user, conv.tenant) == ("personal", USER, TENANT)
    # Its Graph id is whatever Graph says it is; read from shortly before the answer was
    # stored, on the one time Graph filters from below.
    since = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
    chat = "19:opaque_id@unq.gbl.spaces"
    place = chat_place(SETTINGS, chat, TENANT, since)
    assert place.url == f"{GRAPH}/chats/19%3Aopaque_id%40unq.gbl.spaces/messages"
    assert place.params == {
        "$top": "50",
        "$orderby": "lastModifiedDateTime desc",
        "$filter": "lastModifiedDateTime gt 2026-01-02T02:59:05.000Z",
    }


def test_a_group_chat_is_itself_and_a_channel_thread_its_roots_replies() -> None:
    group = Conversation.of(_activity("19:abc@thread.v2", "groupChat"))
    assert group.kind == "groupChat"
    place = chat_place(SETTINGS, group.id, TENANT, None)
    assert place.url == f"{GRAPH}/chats/19%3Aabc%40thread.v2/messages"
    assert "$filter" not in place.params
    # A message in a channel names its team by the team's thread id only (no aadGroupId).
    thread = Conversation.of(
        _activity(
            "19:c@thread.tacv2;messageid=17",
            "channel",
            team={"id": "19:general@thread.tacv2"},
            channel={"id": "19:c@thread.tacv2"},
        )
    )
    assert (thread.team, thread.channel, thread.root) == (
        "19:general@thread.tacv2",
        "19:c@thread.tacv2",
        "17",
    )
    place = thread_place(SETTINGS, "team-1", thread.channel, thread.root, TENANT)
    assert place.url == f"{GRAPH}/teams/team-1/channels/19%3Ac%40thread.tacv2/messages/17/replies"
    assert place.params == {"$top": "50"}  # the only option Graph takes there
    assert "ChannelMessage.Read" in place.permission


@pytest.mark.parametrize(
    ("activity", "named"),
    [
        ({"conversation": {"id": "a:1", "conversationType": "personal"}}, "tenant"),
        (
            {"conversation": {"id": "a:1", "conversationType": "personal", "tenantId": TENANT}},
            "aadObjectId",
        ),
        (_activity("19:c@thread.tacv2;messageid=17", "channel"), "team.id"),
    ],
)
def test_what_the_activity_lacks_is_named_and_the_setting_too(activity, named) -> None:
    with pytest.raises(ToolError) as refused:
        Conversation.of(activity)
    assert named in str(refused.value) and "LIYAGENT_TEAMS_READ_BACK=off" in str(refused.value)


def test_the_apps_manifest_id_is_the_setting_or_else_the_bots_app_id() -> None:
    assert manifest_id(SETTINGS) == APP
    assert manifest_id(TeamsSettings(app_id=APP, manifest_id="m-1")) == "m-1"


def _message(app: str, card: object, content_type: str = "application/vnd.microsoft.card.adaptive"):
    return {
        "from": {"user": None, "application": {"id": app}},
        "attachments": [{"contentType": content_type, "content": json.dumps(card)}],
    }


def test_the_reply_is_this_bots_message_whose_card_carries_the_key() -> None:
    card = {"type": "AdaptiveCard", "body": [{"type": "TextBlock", "id": "k-1", "text": "hi"}]}
    assert is_ours(_message(APP, card), APP, "k-1")
    assert not is_ours(_message(APP, card), APP, "k-2")  # another run's reply
    assert not is_ours(_message("other-app", card), APP, "k-1")  # another bot's
    assert not is_ours(_message(APP, card, "text/html"), APP, "k-1")  # not a card
    person = {"from": {"user": {"id": USER}, "application": None}, "attachments": []}
    assert not is_ours(person, APP, "k-1")
    adaptive = "application/vnd.microsoft.card.adaptive"
    broken = {**_message(APP, card), "attachments": [{"contentType": adaptive, "content": "{"}]}
    assert not is_ours(broken, APP, "k-1")
