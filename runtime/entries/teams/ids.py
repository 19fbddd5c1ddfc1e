"""The ids Microsoft Graph names a Teams conversation by that a message activity does not carry,
each asked of the call Microsoft documents for it, and kept once known.

A channel's team: Graph names a team by its Microsoft 365 group id (a GUID), which Teams sends
as `channelData.team.aadGroupId` in `conversationUpdate` events but not with messages (their
`channelData.team` has the team's thread id only). The Bot Connector's team details, `GET
{serviceUrl}/v3/teams/{channelData.team.id}`, answer it as `aadGroupId`, for a bot installed
in the team ("Get Teams specific context for your bot": get team's details). No Graph
permission is involved; a bot the connector does not show the team to (403, 404) is not
installed in it.

A personal chat: Graph's id of the one-on-one chat between a person and the bot is not the
activity's conversation id (`a:...`) and nothing documents a way to form it. Graph tells it:
the app's installation for the person (`GET /users/{aadObjectId}/teamwork/installedApps?
$expand=teamsApp&$filter=teamsApp/externalId eq '{manifest id}'`; a store app is filtered on
`teamsApp/id`, which is its manifest id), then that installation's chat (`GET .../
installedApps/{installation id}/chat`: its `id`), as "Send proactive installation messages"
(retrieve the conversation chatId) lays out. The app's manifest id is
`LIYAGENT_TEAMS_MANIFEST_ID` (by default the bot's app id). Both calls need the application
permission TeamsAppInstallation.ReadForUser.All (or one above it, such as
TeamsAppInstallation.ReadWriteSelfForUser.All).

Both ids never change for their conversation, so each is kept in this process once known (at
most MAX_KEPT, the least recently used given up first). A refusal is a definite failure naming
what to grant or install; a 429, a 5xx or no answer is tried again (`read_json`) and then
leaves the reply in doubt: no id is ever guessed.
"""

from __future__ import annotations

import re
import threading
from collections import OrderedDict
from collections.abc import Callable

from runtime.entries.teams.connector import OFF, BotConnector, Refusal, q, read_json
from runtime.entries.teams.settings import TeamsSettings
from runtime.sending.call_http import CallHTTP
from runtime.toolbox.tools import ToolError

# How many ids one process keeps.
MAX_KEPT = 10_000
# What Graph's reads of a person's installations and their chat need.
INSTALLS_READ = (
    "TeamsAppInstallation.ReadForUser.All (application; or TeamsAppInstallation."
    "ReadWriteSelfForUser.All)"
)
_GUID = re.compile(r"[0-9a-fA-F]{8}-(?:[0-9a-fA-F]{4}-){3}[0-9a-fA-F]{12}")

_lock = threading.Lock()
_kept: OrderedDict[tuple[str, ...], str] = OrderedDict()


def _remembered(key: tuple[str, ...], find: Callable[[], str]) -> str:
    """The id kept under `key`, else `find()`'s (asked outside the lock), kept from now on."""
    with _lock:
        found = _kept.get(key)
        if found is not None:
            _kept.move_to_end(key)
            return found
    value = find()
    with _lock:
        _kept[key] = value
        _kept.move_to_end(key)
        while len(_kept) > MAX_KEPT:
            _kept.popitem(last=False)
    return value


def manifest_id(settings: TeamsSettings) -> str:
    """The Teams app's manifest id: the setting, or else the bot's app id."""
    return settings.manifest_id or settings.app_id


def team_group_id(settings: TeamsSettings, call: CallHTTP, service_url: str, team: str) -> str:
    """The Microsoft 365 group id of the team activities name `team` (`channelData.team.id`),
    from the Bot Connector at `service_url`."""
    url = f"{service_url.rstrip('/')}/v3/teams/{q(team)}"

    def find() -> str:
        details = read_json(
            BotConnector(settings, call),
            url,
            None,
            Refusal(
                f"to show team {team} (the Graph id of the reply's channel)",
                "install the bot's app in the team",
            ),
        )
        group = details.get("aadGroupId")
        if not isinstance(group, str) or _GUID.fullmatch(group) is None:
            raise ToolError(f"GET {url}: the team's details name no aadGroupId; {OFF}")
        return group.lower()

    return _remembered(("team", service_url.rstrip("/"), settings.app_id, team), find)


def personal_chat_id(settings: TeamsSettings, graph: BotConnector, tenant: str, user: str) -> str:
    """The Graph id of the one-on-one chat between the person `user` (their Entra object id)
    and the bot's app, from Graph (`graph`: requests in `tenant` as the bot)."""
    app = manifest_id(settings)
    base = f"{settings.graph_url}/users/{q(user)}/teamwork/installedApps"
    refusal = Refusal(
        f"to tell the bot's personal chat with {user}", f"grant the bot's app {INSTALLS_READ}"
    )

    def find() -> str:
        installation = _installation(graph, base, app, refusal)
        if installation is None:
            raise ToolError(
                f"Microsoft Graph shows no installation of the Teams app {app} for {user}, so "
                f"the personal chat its reply is in cannot be found; if the app's manifest id "
                f"is not {app}, set LIYAGENT_TEAMS_MANIFEST_ID to it, or {OFF}"
            )
        chat = read_json(graph, f"{base}/{q(installation)}/chat", None, refusal).get("id")
        if not isinstance(chat, str) or not chat:
            raise ToolError(f"GET {base}/{installation}/chat: the chat has no id; {OFF}")
        return chat

    return _remembered(("chat", tenant, settings.app_id, app, user.lower()), find)


def _installation(graph: BotConnector, base: str, app: str, refusal: Refusal) -> str | None:
    """The id of the app's installation for the person, by its manifest id: the catalog's
    `externalId` (an app of the organization's catalog or uploaded), else its `id` (a store
    app's is its manifest id)."""
    literal = app.replace("'", "''")  # an OData string literal
    for field in ("externalId", "id"):
        params = {"$expand": "teamsApp", "$filter": f"teamsApp/{field} eq '{literal}'"}
        found = read_json(graph, base, params, refusal).get("value")
        for item in found if isinstance(found, list) else ():
            if isinstance(item, dict) and isinstance(item.get("id"), str) and item["id"]:
                return str(item["id"])
    return None
