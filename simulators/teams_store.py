"""Postgres storage of what Teams knows beyond the posts themselves: where Graph shows a post,
the teams a bot is installed in, the apps of the catalog and their installations in people's
personal scope, with the one-on-one chat each installation has.

The ids here are the service's own, never derived from what a client could know: a personal
chat's Graph id is generated when the app is installed for the person (as Teams gives it), and
is told only by Graph's documented call for it (`GET /users/{id}/teamwork/installedApps/{id}/
chat`); a team's Microsoft 365 group id is told by the Bot Connector's team details.
Independent of `store.py` (which imports this module for its tables and `GraphPlace`).
"""

from __future__ import annotations

import base64
import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, text

Row = dict[str, Any]

DDL: tuple[str, ...] = (
    # Graph's lag: how long after a post it first shows in Graph's reads (one row, id 1).
    """CREATE TABLE IF NOT EXISTS sim.graph_settings (
        id int PRIMARY KEY CHECK (id = 1), lag_ms int NOT NULL)""",
    # The channels Graph knows, by channel: a channel's replies are read under its team's
    # Microsoft 365 group id.
    """CREATE TABLE IF NOT EXISTS sim.graph_channels (
        channel_id text PRIMARY KEY, team_id text NOT NULL)""",
    # The teams the Bot Connector knows a bot in: by the id activities name the team with
    # (`channelData.team.id`, the thread id of its General channel), with its group id.
    """CREATE TABLE IF NOT EXISTS sim.teams (
        team_id text PRIMARY KEY, aad_group_id text NOT NULL, name text NOT NULL,
        app_id text NOT NULL)""",
    # The tenant's app catalog: a Teams app's catalog id (`teamsApp.id`, generated unless the
    # app is from the store), its manifest id (`externalId`) and the bot it carries.
    """CREATE TABLE IF NOT EXISTS sim.teams_apps (
        id text PRIMARY KEY, external_id text UNIQUE, bot_id text NOT NULL,
        display_name text NOT NULL, distribution_method text NOT NULL)""",
    # An app installed in a person's personal scope, and the one-on-one chat it has with them
    # (Graph id generated at installation).
    """CREATE TABLE IF NOT EXISTS sim.personal_installs (
        id text PRIMARY KEY, user_id text NOT NULL, teams_app_id text NOT NULL,
        chat_id text NOT NULL UNIQUE, tenant_id text,
        created_at timestamptz NOT NULL DEFAULT clock_timestamp(),
        UNIQUE (user_id, teams_app_id))""",
    # The Bot Framework conversations (`a:...`) of personal chats: which Graph chat each is.
    """CREATE TABLE IF NOT EXISTS sim.personal_conversations (
        conversation_id text PRIMARY KEY, chat_id text NOT NULL)""",
)


@dataclass(frozen=True)
class GraphPlace:
    """Where Microsoft Graph shows a post: a chat's messages, or a channel thread's replies."""

    chat: str | None = None
    channel: str | None = None
    root: str | None = None


_GRAPH_POST = "id, activity, app_id, created_at"


def _rows(conn: Connection, sql: str, params: dict[str, Any]) -> list[Row]:
    return [dict(r) for r in conn.execute(text(sql), params).mappings()]


def _first(conn: Connection, sql: str, params: dict[str, Any]) -> Row | None:
    row = conn.execute(text(sql), params).mappings().first()
    return None if row is None else dict(row)


def graph_chat_posts(
    conn: Connection,
    chat: str,
    *,
    skip: int,
    top: int,
    after: datetime | None,
    before: datetime | None,
) -> list[Row]:
    """The posts Graph shows in a chat now, newest first (a bot's posts are never edited
    here, so their last-modified time is their creation time, and one bound serves both)."""
    sql = f"""SELECT {_GRAPH_POST} FROM sim.connector_activities
              WHERE graph_chat = :chat AND visible_at <= clock_timestamp()
                AND (CAST(:after AS timestamptz) IS NULL OR created_at > :after)
                AND (CAST(:before AS timestamptz) IS NULL OR created_at < :before)
              ORDER BY created_at DESC, id DESC OFFSET :skip LIMIT :top"""
    params = {"chat": chat, "after": after, "before": before, "skip": skip, "top": top}
    return _rows(conn, sql, params)


def graph_thread_posts(
    conn: Connection, channel: str, root: str, *, skip: int, top: int
) -> list[Row]:
    """The replies Graph shows in a channel thread now, oldest first."""
    sql = f"""SELECT {_GRAPH_POST} FROM sim.connector_activities
              WHERE graph_channel = :channel AND graph_root = :root
                AND visible_at <= clock_timestamp()
              ORDER BY id OFFSET :skip LIMIT :top"""
    return _rows(conn, sql, {"channel": channel, "root": root, "skip": skip, "top": top})


def set_graph_lag(conn: Connection, lag_ms: int) -> None:
    """How long after a post Graph first shows it (for posts made from now on)."""
    conn.execute(
        text(
            """INSERT INTO sim.graph_settings (id, lag_ms) VALUES (1, :lag)
               ON CONFLICT (id) DO UPDATE SET lag_ms = EXCLUDED.lag_ms"""
        ),
        {"lag": lag_ms},
    )


def upsert_graph_channel(conn: Connection, team_id: str, channel_id: str) -> None:
    """Make a channel known to Graph under its team's group id."""
    conn.execute(
        text(
            """INSERT INTO sim.graph_channels (channel_id, team_id) VALUES (:c, :t)
               ON CONFLICT (channel_id) DO UPDATE SET team_id = EXCLUDED.team_id"""
        ),
        {"c": channel_id, "t": team_id},
    )


def graph_channel_team(conn: Connection, channel_id: str) -> str | None:
    """The group id of the team a channel belongs to, or None when Graph does not know it."""
    sql = "SELECT team_id FROM sim.graph_channels WHERE channel_id = :c"
    row = _first(conn, sql, {"c": channel_id})
    return None if row is None else str(row["team_id"])


def upsert_team(conn: Connection, team_id: str, aad_group_id: str, name: str, app_id: str) -> None:
    """Install the bot `app_id` in a team (its activities' id `team_id`, its group id)."""
    conn.execute(
        text(
            """INSERT INTO sim.teams (team_id, aad_group_id, name, app_id)
               VALUES (:t, :g, :n, :a)
               ON CONFLICT (team_id) DO UPDATE SET aad_group_id = EXCLUDED.aad_group_id,
                   name = EXCLUDED.name, app_id = EXCLUDED.app_id"""
        ),
        {"t": team_id, "g": aad_group_id, "n": name, "a": app_id},
    )


def team(conn: Connection, team_id: str) -> Row | None:
    """A team the Bot Connector knows (by the id activities name it with), or None."""
    sql = "SELECT team_id, aad_group_id, name, app_id FROM sim.teams WHERE team_id = :t"
    return _first(conn, sql, {"t": team_id})


@dataclass(frozen=True)
class PersonalInstall:
    """What installing an app for a person takes: who, which app (its bot, its manifest id and
    how it was distributed), in which tenant, and the Bot Framework conversation of the chat."""

    user_id: str
    bot_id: str
    manifest_id: str
    conversation_id: str
    tenant_id: str | None
    distribution_method: str = "organization"


def install_personal(conn: Connection, install: PersonalInstall) -> None:
    """Install the app for the person (once: its catalog entry, their installation and the
    chat it has with them, ids generated here) and name the conversation as that chat."""
    store_app = install.distribution_method == "store"
    # A store app's catalog id is its manifest id and it has no externalId; any other's
    # catalog id is generated and its manifest id is its externalId.
    catalog_id = install.manifest_id if store_app else str(uuid.uuid4())
    conn.execute(
        text(
            """INSERT INTO sim.teams_apps (id, external_id, bot_id, display_name,
                                           distribution_method)
               VALUES (:id, :ext, :bot, :name, :how) ON CONFLICT DO NOTHING"""
        ),
        {
            "id": catalog_id,
            "ext": None if store_app else install.manifest_id,
            "bot": install.bot_id,
            "name": f"app {install.manifest_id[:8]}",
            "how": install.distribution_method,
        },
    )
    app = _first(
        conn,
        "SELECT id FROM sim.teams_apps WHERE id = :m OR external_id = :m",
        {"m": install.manifest_id},
    )
    assert app is not None
    app_id = str(app["id"])
    # Graph's installation ids read as base64 of the user's id and the app's catalog id.
    installation = base64.b64encode(f"{install.user_id}##{app_id}".encode()).decode()
    chat = f"19:{uuid.uuid4()}_{uuid.uuid4()}@unq.gbl.spaces"
    conn.execute(
        text(
            """INSERT INTO sim.personal_installs (id, user_id, teams_app_id, chat_id, tenant_id)
               VALUES (:id, :user, :app, :chat, :tenant) ON CONFLICT DO NOTHING"""
        ),
        {
            "id": installation,
            "user": install.user_id,
            "app": app_id,
            "chat": chat,
            "tenant": install.tenant_id,
        },
    )
    conn.execute(
        text(
            """INSERT INTO sim.personal_conversations (conversation_id, chat_id)
               SELECT :conv, chat_id FROM sim.personal_installs
               WHERE user_id = :user AND teams_app_id = :app
               ON CONFLICT (conversation_id) DO UPDATE SET chat_id = EXCLUDED.chat_id"""
        ),
        {"conv": install.conversation_id, "user": install.user_id, "app": app_id},
    )


_INSTALL = """i.id, i.user_id, i.chat_id, i.tenant_id, i.created_at, a.id AS app_id,
              a.external_id, a.bot_id, a.display_name, a.distribution_method"""


def personal_installs(
    conn: Connection, user_id: str, tenant_id: str | None, field: str | None, value: str | None
) -> list[Row]:
    """The apps installed for a person in a tenant, optionally only those whose catalog entry
    has `value` as its `field` (`id` or `externalId`)."""
    column = {"id": "a.id", "externalId": "a.external_id", None: None}[field]
    where = "" if column is None else f" AND {column} = :value"
    sql = f"""SELECT {_INSTALL} FROM sim.personal_installs i
              JOIN sim.teams_apps a ON a.id = i.teams_app_id
              WHERE i.user_id = :user AND i.tenant_id IS NOT DISTINCT FROM :tenant{where}
              ORDER BY i.created_at, i.id"""
    return _rows(conn, sql, {"user": user_id, "tenant": tenant_id, "value": value})


def personal_install(conn: Connection, installation_id: str) -> Row | None:
    """One installation (with its app), by its id."""
    sql = f"""SELECT {_INSTALL} FROM sim.personal_installs i
              JOIN sim.teams_apps a ON a.id = i.teams_app_id WHERE i.id = :id"""
    return _first(conn, sql, {"id": installation_id})


def personal_chat_bot(conn: Connection, chat_id: str) -> str | None:
    """The bot whose app a personal chat is with, or None when no installation has the chat."""
    sql = """SELECT a.bot_id FROM sim.personal_installs i
             JOIN sim.teams_apps a ON a.id = i.teams_app_id WHERE i.chat_id = :chat"""
    row = _first(conn, sql, {"chat": chat_id})
    return None if row is None else str(row["bot_id"])


def personal_chat_of(conn: Connection, conversation_id: str) -> str | None:
    """The Graph chat a personal Bot Framework conversation is, or None when Teams has none."""
    sql = "SELECT chat_id FROM sim.personal_conversations WHERE conversation_id = :c"
    row = _first(conn, sql, {"c": conversation_id})
    return None if row is None else str(row["chat_id"])
