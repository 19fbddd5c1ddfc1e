"""Postgres storage of the vendor simulators: the ``sim`` schema and entity rows (what they
recorded and its counts: `records.py`; bot tokens: `bot_tokens.py`).

Plain SQL throughout, so tests and operators can read the records without this package.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, Engine, create_engine, text

from simulators import teams_store
from simulators.bot_tokens import BotToken
from simulators.teams_store import GraphPlace

Row = dict[str, Any]

LIST_LIMIT = 1000
CONNECT_TIMEOUT_S = 10

# Two-int advisory keys live apart from the one-bigint key space the engine may use.
_SCHEMA_LOCK = "SELECT pg_advisory_xact_lock(hashtext('liyagent.sim.schema'), 0)"
_KEY_LOCK = "SELECT pg_advisory_xact_lock(hashtext(:namespace), hashtext(:key))"

DDL: tuple[str, ...] = (
    "CREATE SCHEMA IF NOT EXISTS sim",
    """CREATE TABLE IF NOT EXISTS sim.requests (
        id bigserial PRIMARY KEY, vendor text NOT NULL, method text NOT NULL, path text NOT NULL,
        idem_key text, run_id text, attempt integer, body jsonb, status integer NOT NULL,
        deduped boolean NOT NULL DEFAULT false, created_at timestamptz NOT NULL DEFAULT now())""",
    "CREATE INDEX IF NOT EXISTS requests_vendor_idx ON sim.requests (vendor, method)",
    # The call site a request came from (X-Liyagent-Call: step and call id; for the model, the
    # step asked for), so duplicates are counted per run and call site, whatever key was sent.
    "ALTER TABLE sim.requests ADD COLUMN IF NOT EXISTS call text",
    """CREATE TABLE IF NOT EXISTS sim.faults (
        id bigserial PRIMARY KEY, method text NOT NULL, path text NOT NULL, status int NOT NULL,
        remaining int NOT NULL, after boolean NOT NULL, delay_ms int NOT NULL DEFAULT 0,
        run_id text, created_at timestamptz NOT NULL DEFAULT now())""",
    """CREATE TABLE IF NOT EXISTS sim.model_scripts (
        model text PRIMARY KEY, script jsonb NOT NULL,
        created_at timestamptz NOT NULL DEFAULT now())""",
    "CREATE INDEX IF NOT EXISTS requests_idem_key_idx ON sim.requests (idem_key)",
    # The model's rate limit (simulators/rate_limit.py).
    """CREATE TABLE IF NOT EXISTS sim.model_limits (
        id text PRIMARY KEY, requests int NOT NULL, window_ms int NOT NULL, retry_after_s int,
        window_start timestamptz, used int NOT NULL DEFAULT 0)""",
    # Its limit on tokens (simulators/token_limit.py): per window, and what is left of each
    # bucket as of `tokens_at` (NULL: full); a limit on tokens alone limits no requests.
    "ALTER TABLE sim.model_limits ALTER COLUMN requests DROP NOT NULL",
    """ALTER TABLE sim.model_limits ADD COLUMN IF NOT EXISTS tokens int,
        ADD COLUMN IF NOT EXISTS input_tokens int, ADD COLUMN IF NOT EXISTS output_tokens int,
        ADD COLUMN IF NOT EXISTS tokens_left double precision,
        ADD COLUMN IF NOT EXISTS input_tokens_left double precision,
        ADD COLUMN IF NOT EXISTS output_tokens_left double precision,
        ADD COLUMN IF NOT EXISTS tokens_at timestamptz""",
    # The usage a model's answer reported (what throughput is judged by).
    """ALTER TABLE sim.requests ADD COLUMN IF NOT EXISTS prompt_tokens int,
        ADD COLUMN IF NOT EXISTS completion_tokens int""",
    # Of them, the prompt tokens it reported cached (what a ledger is judged by).
    "ALTER TABLE sim.requests ADD COLUMN IF NOT EXISTS cached_tokens int",
    "CREATE INDEX IF NOT EXISTS requests_run_id_idx ON sim.requests (run_id)",
    """CREATE TABLE IF NOT EXISTS sim.incidents (
        id bigserial PRIMARY KEY, idem_key text, title text NOT NULL, severity text NOT NULL,
        created_at timestamptz NOT NULL DEFAULT now(),
        updated_at timestamptz NOT NULL DEFAULT now())""",
    "CREATE INDEX IF NOT EXISTS incidents_idem_key_idx ON sim.incidents (idem_key, created_at)",
    """CREATE TABLE IF NOT EXISTS sim.incident_updates (
        id bigserial PRIMARY KEY, incident_id bigint NOT NULL REFERENCES sim.incidents (id),
        idem_key text, body text NOT NULL, created_at timestamptz NOT NULL DEFAULT now())""",
    """CREATE INDEX IF NOT EXISTS incident_updates_key_idx
        ON sim.incident_updates (incident_id, idem_key, created_at)""",
    """CREATE TABLE IF NOT EXISTS sim.comments (
        id bigserial PRIMARY KEY, issue text NOT NULL, body text NOT NULL, idem_key text,
        created_at timestamptz NOT NULL DEFAULT now())""",
    "CREATE INDEX IF NOT EXISTS comments_idem_key_idx ON sim.comments (idem_key)",
    "CREATE INDEX IF NOT EXISTS comments_issue_idx ON sim.comments (issue)",
    """CREATE TABLE IF NOT EXISTS sim.chat_replies (
        id bigserial PRIMARY KEY, conversation text NOT NULL, text text NOT NULL,
        cards jsonb NOT NULL DEFAULT '[]'::jsonb, idem_key text,
        created_at timestamptz NOT NULL DEFAULT now())""",
    "CREATE INDEX IF NOT EXISTS chat_replies_idem_key_idx ON sim.chat_replies (idem_key)",
    "CREATE INDEX IF NOT EXISTS chat_replies_conv_idx ON sim.chat_replies (conversation)",
    """CREATE TABLE IF NOT EXISTS sim.notifications (
        id bigserial PRIMARY KEY, channel text NOT NULL, text text NOT NULL, idem_key text,
        created_at timestamptz NOT NULL DEFAULT now())""",
    """CREATE INDEX IF NOT EXISTS notifications_idem_key_idx
        ON sim.notifications (idem_key, created_at)""",
    "CREATE INDEX IF NOT EXISTS notifications_channel_idx ON sim.notifications (channel)",
    """CREATE TABLE IF NOT EXISTS sim.a2a_tasks (
        id bigserial PRIMARY KEY, task_id text NOT NULL, agent text, message text NOT NULL,
        status text NOT NULL, answer text NOT NULL,
        created_at timestamptz NOT NULL DEFAULT now())""",
    "CREATE INDEX IF NOT EXISTS a2a_tasks_task_id_idx ON sim.a2a_tasks (task_id, id)",
    "ALTER TABLE sim.a2a_tasks ADD COLUMN IF NOT EXISTS context_id text",
    # What the Bot Connector received: each post of an activity to a conversation.
    """CREATE TABLE IF NOT EXISTS sim.connector_activities (
        id bigserial PRIMARY KEY, conversation text NOT NULL, reply_to_id text,
        activity jsonb NOT NULL, idem_key text, created_at timestamptz NOT NULL DEFAULT now())""",
    """CREATE INDEX IF NOT EXISTS connector_activities_key_idx
        ON sim.connector_activities (conversation, idem_key)""",
    # Which bot posted (the app its bearer token was issued to) and with which token.
    "ALTER TABLE sim.connector_activities ADD COLUMN IF NOT EXISTS app_id text",
    "ALTER TABLE sim.connector_activities ADD COLUMN IF NOT EXISTS token_id bigint",
    # Bots the token endpoint knows (their password's SHA-256 only) and the tokens it issued.
    """CREATE TABLE IF NOT EXISTS sim.bots (
        app_id text PRIMARY KEY, password_sha256 text NOT NULL, token_ttl_s double precision
        NOT NULL, created_at timestamptz NOT NULL DEFAULT now())""",
    """CREATE TABLE IF NOT EXISTS sim.bot_tokens (
        id bigserial PRIMARY KEY, token text NOT NULL UNIQUE, app_id text NOT NULL,
        issued_at timestamptz NOT NULL DEFAULT clock_timestamp(),
        expires_at timestamptz NOT NULL)""",
    # A token is for one scope (the Bot Connector's or Microsoft Graph's) and, for Graph, one
    # tenant: each service refuses a token issued for the other.
    "ALTER TABLE sim.bot_tokens ADD COLUMN IF NOT EXISTS scope text",
    "ALTER TABLE sim.bot_tokens ADD COLUMN IF NOT EXISTS tenant text",
    # Where Microsoft Graph shows a post: a chat (personal or group) or a channel thread (the
    # channel and its root message), and from when (a post is visible after Graph's lag).
    "ALTER TABLE sim.connector_activities ADD COLUMN IF NOT EXISTS graph_chat text",
    "ALTER TABLE sim.connector_activities ADD COLUMN IF NOT EXISTS graph_channel text",
    "ALTER TABLE sim.connector_activities ADD COLUMN IF NOT EXISTS graph_root text",
    "ALTER TABLE sim.connector_activities ADD COLUMN IF NOT EXISTS visible_at timestamptz",
    """CREATE INDEX IF NOT EXISTS connector_activities_graph_chat_idx
        ON sim.connector_activities (graph_chat, id)""",
    """CREATE INDEX IF NOT EXISTS connector_activities_graph_thread_idx
        ON sim.connector_activities (graph_channel, graph_root, id)""",
    """CREATE TABLE IF NOT EXISTS sim.fine_tunes (
        id text PRIMARY KEY, model text NOT NULL, dataset text NOT NULL, idem_key text,
        duration_s double precision NOT NULL, created_at timestamptz NOT NULL DEFAULT now())""",
    """CREATE INDEX IF NOT EXISTS fine_tunes_idem_key_idx
        ON sim.fine_tunes (idem_key, created_at)""",
)

_INCIDENT = "id, title, severity, idem_key, created_at, updated_at"
_UPDATE = "id, incident_id, body, idem_key, created_at"
_COMMENT = "id, issue, body, idem_key, created_at"
_REPLY = "id, conversation, text, cards, idem_key, created_at"
_NOTIFICATION = "id, channel, text, idem_key, created_at"
# A task as the remote agent shows it: the task id is ``id``, our row id is ``row``.
_TASK = 'task_id AS id, status, answer, context_id, id AS "row"'
_TASK_DETAIL = f"{_TASK}, agent, message, created_at"
_WINDOW = "created_at > clock_timestamp() - make_interval(secs => :window)"
# A fine-tune job runs until its duration has passed by the database clock, then has succeeded.
_FT_DONE = "clock_timestamp() >= created_at + make_interval(secs => duration_s)"
_FT_STATUS = f"CASE WHEN {_FT_DONE} THEN 'succeeded' ELSE 'running' END AS status"
_FINE_TUNE = f"id, model, dataset, {_FT_STATUS}, created_at"
# ``:`` and ``ft-`` apart, so the literal is not read as a bind parameter ``:ft``.
_FT_MODEL = f"CASE WHEN {_FT_DONE} THEN model || ':' || 'ft-' || id END AS fine_tuned_model"
_FINE_TUNE_STATE = f"id, model, {_FT_STATUS}, {_FT_MODEL}"


def make_engine(database_url: str) -> Engine:
    """An autocommit engine for ``database_url``; a bare ``postgresql://`` URL uses psycopg 3."""
    for prefix in ("postgresql://", "postgres://"):
        if database_url.startswith(prefix):
            database_url = "postgresql+psycopg://" + database_url[len(prefix) :]
    return create_engine(
        database_url,
        isolation_level="AUTOCOMMIT",
        pool_pre_ping=True,
        # Recorded request bodies carry users' text: never in exception messages.
        hide_parameters=True,
        # A few connections are kept (a vendor does not fork a database backend per request);
        # a burst opens more, closed when it ends: kept, a burst's 50 stayed open for the whole
        # session, and three test sessions' simulators held most of a server's 100 connections
        # (the engine's workers then met "too many clients").
        pool_size=8,
        max_overflow=42,
        connect_args={"connect_timeout": CONNECT_TIMEOUT_S},
    )


def transactional(engine: Engine) -> Engine:
    """The same pool with real transactions, for writes that must commit together."""
    return engine.execution_options(isolation_level="READ COMMITTED")


def ensure_schema(engine: Engine) -> None:
    """Create the ``sim`` schema and tables if missing; an advisory lock serialises racing starts.

    Two simulators starting at once against one database would otherwise collide on the DDL.
    """
    with transactional(engine).begin() as conn:
        conn.execute(text(_SCHEMA_LOCK))
        for statement in (*DDL, *teams_store.DDL):
            conn.execute(text(statement))


def json_param(value: Any) -> str | None:
    """Serialise ``value`` for a jsonb column; Postgres rejects NUL, so it becomes U+FFFD."""
    if value is None:
        return None
    return json.dumps(value).replace("\\u0000", "\\ufffd")


def _jsonable(row: Mapping[Any, Any]) -> Row:
    """A result row as a JSON-ready dict (timestamps in ISO 8601)."""
    return {str(k): v.isoformat() if isinstance(v, datetime) else v for k, v in row.items()}


def _one(conn: Connection, sql: str, params: Mapping[str, Any]) -> Row | None:
    """The first row of ``sql`` as a JSON-ready dict, or None."""
    row = conn.execute(text(sql), dict(params)).mappings().first()
    return None if row is None else _jsonable(row)


def _all(conn: Connection, sql: str, params: Mapping[str, Any]) -> list[Row]:
    """All rows of ``sql`` as JSON-ready dicts."""
    return [_jsonable(r) for r in conn.execute(text(sql), dict(params)).mappings()]


def _inserted(conn: Connection, sql: str, params: Mapping[str, Any]) -> Row:
    """The row an ``INSERT ... RETURNING`` statement wrote."""
    row = _one(conn, sql, params)
    if row is None:  # pragma: no cover - RETURNING always yields the inserted row
        raise RuntimeError("insert returned no row")
    return row


def where_clause(filters: Mapping[str, object]) -> tuple[str, dict[str, object]]:
    """A WHERE clause over the non-None ``filters`` (column names come from code, not input)."""
    given = {column: value for column, value in filters.items() if value is not None}
    clause = " AND ".join(f"{column} = :{column}" for column in given)
    return ("WHERE " + clause if clause else ""), given


def lock_idem_key(conn: Connection, namespace: str, key: str) -> None:
    """Serialise writers of one idempotency key until the transaction ends (race-free dedupe)."""
    conn.execute(text(_KEY_LOCK), {"namespace": "liyagent.sim." + namespace, "key": key})


def recent_incident(conn: Connection, key: str, window_s: float) -> Row | None:
    """The newest incident created with ``key`` less than ``window_s`` seconds ago."""
    sql = f"SELECT {_INCIDENT} FROM sim.incidents WHERE idem_key = :key AND {_WINDOW}"
    return _one(conn, sql + " ORDER BY id DESC LIMIT 1", {"key": key, "window": window_s})


def insert_incident(conn: Connection, title: str, severity: str, key: str | None) -> Row:
    """Create an incident row."""
    sql = f"""INSERT INTO sim.incidents (title, severity, idem_key)
              VALUES (:title, :severity, :key) RETURNING {_INCIDENT}"""
    return _inserted(conn, sql, {"title": title, "severity": severity, "key": key})


def incident(conn: Connection, incident_id: int) -> Row | None:
    """One incident by id, or None."""
    return _one(conn, f"SELECT {_INCIDENT} FROM sim.incidents WHERE id = :id", {"id": incident_id})


def incidents(conn: Connection, key: str | None) -> list[Row]:
    """Incidents carrying ``key`` (all incidents when None), oldest first."""
    where = "" if key is None else "WHERE idem_key = :key"
    sql = f"SELECT {_INCIDENT} FROM sim.incidents {where} ORDER BY id LIMIT {LIST_LIMIT}"
    return _all(conn, sql, {"key": key})


def recent_incident_update(
    conn: Connection, incident_id: int, key: str, window_s: float
) -> Row | None:
    """The newest update of an incident made with ``key`` less than ``window_s`` seconds ago."""
    sql = f"""SELECT {_UPDATE} FROM sim.incident_updates
              WHERE incident_id = :iid AND idem_key = :key AND {_WINDOW}
              ORDER BY id DESC LIMIT 1"""
    return _one(conn, sql, {"iid": incident_id, "key": key, "window": window_s})


def insert_incident_update(conn: Connection, incident_id: int, body: str, key: str | None) -> Row:
    """Add an update to an incident and touch the incident's ``updated_at``."""
    conn.execute(
        text("UPDATE sim.incidents SET updated_at = now() WHERE id = :id"), {"id": incident_id}
    )
    sql = f"""INSERT INTO sim.incident_updates (incident_id, body, idem_key)
              VALUES (:iid, :body, :key) RETURNING {_UPDATE}"""
    return _inserted(conn, sql, {"iid": incident_id, "body": body, "key": key})


def incident_updates(conn: Connection, incident_id: int) -> list[Row]:
    """The updates of one incident, oldest first."""
    sql = f"SELECT {_UPDATE} FROM sim.incident_updates WHERE incident_id = :iid ORDER BY id"
    return _all(conn, sql + f" LIMIT {LIST_LIMIT}", {"iid": incident_id})


def insert_comment(conn: Connection, issue: str, body: str, key: str | None) -> Row:
    """Create a comment row (never deduplicated: that is this vendor's point)."""
    sql = f"""INSERT INTO sim.comments (issue, body, idem_key)
              VALUES (:issue, :body, :key) RETURNING {_COMMENT}"""
    return _inserted(conn, sql, {"issue": issue, "body": body, "key": key})


def comments(conn: Connection, *, issue: str | None = None, key: str | None = None) -> list[Row]:
    """Comments filtered by issue and/or idempotency key, oldest first."""
    where, params = where_clause({"issue": issue, "idem_key": key})
    sql = f"SELECT {_COMMENT} FROM sim.comments {where} ORDER BY id LIMIT {LIST_LIMIT}"
    return _all(conn, sql, params)


def insert_chat_reply(
    conn: Connection, conversation: str, reply_text: str, cards: list[Any], key: str | None
) -> Row:
    """Create a chat reply row (never deduplicated)."""
    sql = f"""INSERT INTO sim.chat_replies (conversation, text, cards, idem_key)
              VALUES (:conv, :text, CAST(:cards AS jsonb), :key) RETURNING {_REPLY}"""
    params = {"conv": conversation, "text": reply_text, "cards": json_param(cards), "key": key}
    return _inserted(conn, sql, params)


def chat_replies(
    conn: Connection, *, conversation: str | None = None, key: str | None = None
) -> list[Row]:
    """Chat replies filtered by conversation and/or idempotency key, oldest first."""
    where, params = where_clause({"conversation": conversation, "idem_key": key})
    sql = f"SELECT {_REPLY} FROM sim.chat_replies {where} ORDER BY id LIMIT {LIST_LIMIT}"
    return _all(conn, sql, params)


def recent_notification(conn: Connection, key: str, window_s: float) -> Row | None:
    """The newest notification sent with ``key`` less than ``window_s`` seconds ago."""
    sql = f"SELECT {_NOTIFICATION} FROM sim.notifications WHERE idem_key = :key AND {_WINDOW}"
    return _one(conn, sql + " ORDER BY id DESC LIMIT 1", {"key": key, "window": window_s})


def insert_notification(conn: Connection, channel: str, message: str, key: str | None) -> Row:
    """Create a notification row."""
    sql = f"""INSERT INTO sim.notifications (channel, text, idem_key)
              VALUES (:channel, :text, :key) RETURNING {_NOTIFICATION}"""
    return _inserted(conn, sql, {"channel": channel, "text": message, "key": key})


def notifications(
    conn: Connection, *, channel: str | None = None, key: str | None = None
) -> list[Row]:
    """Notifications filtered by channel and/or idempotency key, oldest first."""
    where, params = where_clause({"channel": channel, "idem_key": key})
    sql = f"SELECT {_NOTIFICATION} FROM sim.notifications {where} ORDER BY id LIMIT {LIST_LIMIT}"
    return _all(conn, sql, params)


def insert_a2a_task(
    conn: Connection,
    task_id: str,
    agent: str | None,
    message: str,
    answer: str,
    context_id: str | None = None,
) -> Row:
    """Create a completed task row (never deduplicated: a repeated task id adds a row)."""
    sql = f"""INSERT INTO sim.a2a_tasks (task_id, agent, message, status, answer, context_id)
              VALUES (:task_id, :agent, :message, 'completed', :answer, :ctx) RETURNING {_TASK}"""
    params = {
        "task_id": task_id,
        "agent": agent,
        "message": message,
        "answer": answer,
        "ctx": context_id,
    }
    return _inserted(conn, sql, params)


def a2a_task(conn: Connection, task_id: str) -> Row | None:
    """The first task row created with ``task_id``, or None."""
    sql = f"SELECT {_TASK_DETAIL} FROM sim.a2a_tasks WHERE task_id = :task_id ORDER BY id LIMIT 1"
    return _one(conn, sql, {"task_id": task_id})


_ACTIVITY = (
    'id::text AS id, conversation, reply_to_id AS "replyToId", activity, '
    'idem_key AS "idempotencyKey", created_at AS "createdAt"'
)


def insert_connector_activity(
    conn: Connection,
    conversation: str,
    reply_to_id: str | None,
    activity: dict[str, Any],
    key: str | None,
    bot: BotToken,
    place: GraphPlace | None = None,
) -> Row:
    """Keep one post to the Bot Connector by `bot`'s token (never deduplicated), shown by
    Graph at `place` once Graph's lag has passed."""
    place = place or GraphPlace()
    sql = f"""INSERT INTO sim.connector_activities
                (conversation, reply_to_id, activity, idem_key, app_id, token_id,
                 graph_chat, graph_channel, graph_root, visible_at)
              VALUES (:conv, :reply_to, CAST(:activity AS jsonb), :key, :app_id, :token_id,
                      :chat, :channel, :root,
                      clock_timestamp() + make_interval(secs => COALESCE(
                          (SELECT lag_ms FROM sim.graph_settings WHERE id = 1), 0) / 1000.0))
              RETURNING {_ACTIVITY}"""
    params = {
        "conv": conversation,
        "reply_to": reply_to_id,
        "activity": json_param(activity),
        "key": key,
        "app_id": bot.app_id,
        "token_id": bot.token_id,
        "chat": place.chat,
        "channel": place.channel,
        "root": place.root,
    }
    return _inserted(conn, sql, params)


def recent_fine_tune(conn: Connection, key: str, window_s: float) -> Row | None:
    """The newest fine-tune job created with ``key`` less than ``window_s`` seconds ago."""
    sql = f"SELECT {_FINE_TUNE} FROM sim.fine_tunes WHERE idem_key = :key AND {_WINDOW}"
    return _one(conn, sql + " ORDER BY created_at DESC LIMIT 1", {"key": key, "window": window_s})


def insert_fine_tune(
    conn: Connection, model: str, dataset: str, duration_s: float, key: str | None
) -> Row:
    """Create a fine-tune job row with a fresh ``ft-<12 hex>`` id."""
    sql = f"""INSERT INTO sim.fine_tunes (id, model, dataset, idem_key, duration_s)
              VALUES (:id, :model, :dataset, :key, :duration) RETURNING {_FINE_TUNE}"""
    params = {
        "id": "ft-" + secrets.token_hex(6),
        "model": model,
        "dataset": dataset,
        "key": key,
        "duration": duration_s,
    }
    return _inserted(conn, sql, params)


def fine_tune(conn: Connection, job_id: str) -> Row | None:
    """One fine-tune job's state (``fine_tuned_model`` is null while running), or None."""
    sql = f"SELECT {_FINE_TUNE_STATE} FROM sim.fine_tunes WHERE id = :id"
    return _one(conn, sql, {"id": job_id})


def save_model_script(conn: Connection, model: str, script: Any) -> None:
    """Keep a script under its content-derived model name (saving it again changes nothing)."""
    conn.execute(
        text(
            "INSERT INTO sim.model_scripts (model, script) VALUES (:m, CAST(:s AS jsonb)) "
            "ON CONFLICT (model) DO NOTHING"
        ),
        {"m": model, "s": json_param(script)},
    )


def model_script(conn: Connection, model: str) -> Any:
    """The script a model name plays, or None."""
    return conn.execute(
        text("SELECT script FROM sim.model_scripts WHERE model = :m"), {"m": model}
    ).scalar_one_or_none()


@dataclass(frozen=True)
class Fault:
    """An armed fault: requests it matches answer `status`, before or after their effect."""

    method: str
    path: str
    status: int
    times: int = 1
    after: bool = False
    delay_ms: int = 0
    # Only requests of this run (X-Liyagent-Run), so tests sharing a simulator stay apart.
    run_id: str | None = None


def insert_fault(conn: Connection, fault: Fault) -> int:
    sql = """INSERT INTO sim.faults (method, path, status, remaining, after, delay_ms, run_id)
             VALUES (:method, :path, :status, :times, :after, :delay_ms, :run_id) RETURNING id"""
    return int(conn.execute(text(sql), asdict(fault)).scalar_one())


def take_fault(conn: Connection, request: Any) -> Fault | None:
    """Use up one firing of the oldest armed fault matching the request, if any."""
    row = conn.execute(
        text(
            """
            UPDATE sim.faults SET remaining = remaining - 1
            WHERE id = (SELECT id FROM sim.faults
                        WHERE remaining > 0 AND method = :m AND :p LIKE path || '%'
                          AND (run_id IS NULL OR run_id = :r)
                        ORDER BY id LIMIT 1 FOR UPDATE)
            RETURNING method, path, status, after, delay_ms, run_id
            """
        ),
        {"m": request.method, "p": request.path, "r": request.run_id},
    ).first()
    if row is None:
        return None
    return Fault(row.method, row.path, row.status, 1, row.after, row.delay_ms, row.run_id)
