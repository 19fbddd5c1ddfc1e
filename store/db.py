"""Engines per process: autocommit, so every fenced write is one statement and one commit."""

from __future__ import annotations

import contextlib
import functools
import json
import os
import select
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import sqlalchemy as sa
from psycopg.types.string import TextLoader

DEFAULT_DATABASE_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/liyagent"


class Pooler(StrEnum):
    """What stands between a process and Postgres (LIYAGENT_DATABASE_POOLER): what its
    connections may ask of a server session."""

    # The server itself: each connection is a session of its own, its bounds given at connect.
    NONE = "none"
    # PgBouncer (any pool mode, transaction pooling included): a statement may run on any
    # server session, so nothing is left on one (no server-side prepared statement) and nothing
    # is asked at connect (startup options are refused by 1.18, ignored or refused by later
    # versions); the bounds are the server's own for the role (`session_bounds`).
    PGBOUNCER = "pgbouncer"


# This process's engines by URL and pooler; a forked child forgets its parent's
# (`forget_after_fork`, called by the owner of process-wide state, runtime/base/process.py).
_lock = threading.Lock()
_engines: dict[tuple[str, Pooler], sa.Engine] = {}

# A stalled client must never hold a row lock the sweeper waits on: each fenced write is a
# single autocommit statement, and the server ends any transaction left idle or any wait
# that outlasts these bounds (ms). A direct link sets them at connect (startup options);
# behind a pooler the server must hold them for the role (checked at start).
SESSION_BOUNDS_MS = {
    "idle_in_transaction_session_timeout": 10_000,
    "lock_timeout": 5_000,
    "statement_timeout": 30_000,
}
_SESSION_OPTIONS = " ".join(f"-c {name}={ms}" for name, ms in SESSION_BOUNDS_MS.items())


# A server that went away without closing its sockets (a host lost, a network cut) is noticed
# within seconds, not after the kernel's two hours: libpq's TCP keepalives (idle 5 s, then every
# 2 s, dead after 3 unanswered), unacknowledged bytes given up after 10 s, and a connect that
# waits at most 5 s per host (a multi-host URL then tries the next one).
CONNECT_TIMEOUT_S = 5
# How long a process's Postgres probe waits for an answer before it counts as not reached.
PROBE_TIMEOUT_MS = 2000
_LINK_OPTIONS: dict[str, Any] = {
    "connect_timeout": CONNECT_TIMEOUT_S,
    "keepalives": 1,
    "keepalives_idle": 5,
    "keepalives_interval": 2,
    "keepalives_count": 3,
    "tcp_user_timeout": 10_000,
}


@functools.lru_cache(maxsize=1024)
def sql(text: str) -> sa.TextClause:
    """The statement for this SQL text, built once per process: a hot statement's text is not
    parsed for its bind parameters again at every execution (clauses are immutable: shared)."""
    return sa.text(text)


def _uuid_as_text(dbapi_conn: Any, _record: Any) -> None:
    # Run ids travel as strings (task arguments, lease tokens, logs): load uuid columns so.
    dbapi_conn.adapters.register_loader("uuid", TextLoader)


def _discard_if_closed(dbapi_conn: Any, _record: Any, _proxy: Any) -> None:
    """An idle pooled connection whose socket has something to read was closed by the server
    (or told it is shutting down): discard it without a round trip; the pool retries."""
    if dbapi_conn.closed or dbapi_conn.broken:
        raise sa.exc.DisconnectionError("the pooled connection is closed")
    readable, _, _ = select.select([dbapi_conn.pgconn.socket], [], [], 0)
    if readable:
        raise sa.exc.DisconnectionError("the server closed the pooled connection")


# A statement refused because the server takes no writes (read_only_sql_transaction): a
# primary demoted or put in read-only mode. The connection is of no use to a multi-host URL
# that asks for a writable host: it is dropped with the rest of the pool, like a broken one.
_READ_ONLY = "25006"


def _read_only_is_a_disconnect(context: sa.engine.ExceptionContext) -> None:
    if getattr(context.original_exception, "sqlstate", None) == _READ_ONLY:
        context.is_disconnect = True


# Connections one process's engine may open when nothing sizes it (a prefork child, the CLI, the
# front).
DEFAULT_POOL_MAX = 15


def _session_args(pooler: Pooler, options: str) -> dict[str, Any]:
    """What a connection asks of its server session: its `options` on a direct link; behind a
    pooler nothing that outlives a statement. psycopg prepares a statement server-side after
    its fifth execution on a connection (`prepare_threshold`), and behind PgBouncer 1.18 the
    next one lands on another server session ("prepared statement _pg3_0 does not exist", or
    "already exists" on a session another client prepared on): never prepared there."""
    if pooler is Pooler.NONE:
        return {"options": options}
    return {"prepare_threshold": None}


def create(
    url: str,
    pool_max: int = DEFAULT_POOL_MAX,
    application_name: str = "",
    pooler: Pooler = Pooler.NONE,
) -> sa.Engine:
    """A new engine for `url` in autocommit mode with the server-side safety bounds above,
    opening at most `pool_max` connections: each is checked out for one statement only (never
    across a model or tool call), so a thread waits for the pool only when more threads than
    that are inside a statement at once. A connection is opened when no idle one is free and
    then kept: the pool holds at most the most statements the process had in flight at once.
    (Keeping an eighth and closing the rest after a burst opened 2.7 connections per run of a
    `-P threads -c 500` worker: a backend forked and torn down each time, most of Postgres's
    CPU in `make bench`'s density section; kept, 154.) `application_name` names them in
    `pg_stat_activity` (the process's holder). Behind a `pooler`, its connections ask nothing
    of a server session (`_session_args`)."""
    connect_args: dict[str, Any] = {**_session_args(pooler, _SESSION_OPTIONS), **_LINK_OPTIONS}
    if application_name:
        connect_args["application_name"] = application_name[:63]
    engine = sa.create_engine(
        url,
        isolation_level="AUTOCOMMIT",
        # No ping per checkout (a round trip each time): `_discard_if_closed` notices, locally,
        # a pooled connection the server has closed (a restart, a primary killed) and the pool
        # takes a new one; a connection found broken in use invalidates every older one in the
        # pool (SQLAlchemy's disconnect handling), so a failover costs one failed statement.
        pool_pre_ping=False,
        # SQL parameters carry users' text: never put them in exception messages, which reach
        # logs and audit rows.
        hide_parameters=True,
        pool_size=pool_max,
        max_overflow=0,
        connect_args=connect_args,
    )
    sa.event.listen(engine, "connect", _uuid_as_text)
    sa.event.listen(engine, "checkout", _discard_if_closed)
    sa.event.listen(engine, "handle_error", _read_only_is_a_disconnect)
    return engine


def probe_engine(url: str, application_name: str = "", pooler: Pooler = Pooler.NONE) -> sa.Engine:
    """One connection for a process's Postgres probe (runtime/fleet/heartbeat.py), apart from
    the run threads' pool (a busy pool must not read as an outage), and quick to give up on a
    cut link: unacknowledged bytes after PROBE_TIMEOUT_MS, a connect after 2 s. (Behind a
    pooler its statement runs under the role's bound; a probe unanswered for PROBE_TIMEOUT_MS
    counts as failed all the same, runtime/fleet/reach.py.)"""
    connect_args: dict[str, Any] = {
        **_LINK_OPTIONS,
        "connect_timeout": 2,
        "tcp_user_timeout": PROBE_TIMEOUT_MS,
        **_session_args(pooler, f"-c statement_timeout={PROBE_TIMEOUT_MS}"),
    }
    if application_name:
        connect_args["application_name"] = application_name[:63]
    return sa.create_engine(
        url,
        isolation_level="AUTOCOMMIT",
        pool_pre_ping=False,
        hide_parameters=True,
        pool_size=1,
        max_overflow=0,
        connect_args=connect_args,
    )


def engine_for(
    url: str,
    pool_max: int = DEFAULT_POOL_MAX,
    application_name: str = "",
    pooler: Pooler = Pooler.NONE,
) -> sa.Engine:
    """The engine for `url` behind `pooler` in this process; a forked child gets its own, never
    its parent's (`forget_after_fork`). The first caller in a process sizes and names it (the
    process's services)."""
    with _lock:
        engine = _engines.get((url, pooler))
        if engine is None:
            engine = _engines[url, pooler] = create(url, pool_max, application_name, pooler)
        return engine


def forget_after_fork() -> None:
    """In a forked child, right after the fork: forget the parent's engines without closing its
    sockets (`dispose(close=False)`); the lock is replaced, never taken (a parent's thread may
    have held it)."""
    global _lock, _engines
    inherited, _engines, _lock = list(_engines.values()), {}, threading.Lock()
    for engine in inherited:
        engine.dispose(close=False)


def database_url_from_env() -> str:
    """The database `LIYAGENT_DATABASE_URL` names, or the local default."""
    return os.environ.get("LIYAGENT_DATABASE_URL") or DEFAULT_DATABASE_URL


@contextlib.contextmanager
def transaction(engine: sa.Engine) -> Iterator[sa.Connection]:
    """One real transaction on `engine` (whose connections autocommit each statement): for
    statements that commit together, or a lock held to the commit (`pg_advisory_xact_lock`)."""
    with engine.connect() as conn:
        conn.execution_options(isolation_level="READ COMMITTED")
        with conn.begin():
            yield conn


def to_json(value: Any) -> str:
    """A JSON parameter for a jsonb column: keys sorted, anything else as its text."""
    return json.dumps(value, sort_keys=True, default=str)


def ping(engine: sa.Engine) -> None:
    """One round trip to Postgres; raises if it does not answer."""
    with engine.connect() as conn:
        conn.execute(sql("SELECT 1"))


def session_bounds(engine: sa.Engine) -> tuple[str, dict[str, int]]:
    """The role `engine` connects as and the bounds (SESSION_BOUNDS_MS's names, in ms, 0 for
    none) a session of it gets from the server: what the role, its database or a pooler's
    connect query set, the same on every server session a pooler hands out."""
    with engine.connect() as conn:
        rows = conn.execute(
            sql(
                "SELECT current_user AS role, name, setting::int AS ms FROM pg_settings "
                "WHERE name = ANY(:names)"
            ),
            {"names": list(SESSION_BOUNDS_MS)},
        ).all()
    role = rows[0].role if rows else ""
    return role, {row.name: row.ms for row in rows}


def ping_schema(engine: sa.Engine) -> None:
    """One round trip that also needs the schema: raises ProgrammingError (undefined table)
    on a database that was created but never migrated."""
    with engine.connect() as conn:
        conn.execute(sql("SELECT 1 FROM runs LIMIT 0"))


# SQLSTATE classes and codes that mean the server cannot be used at all (as opposed to one
# statement failing): connection exceptions, authorisation, a missing database, too many
# connections, and a server shutting down or starting up.
_UNREACHABLE_CLASSES = ("08", "28", "3D", "53")
_UNREACHABLE_CODES = ("57P01", "57P02", "57P03")


def unreachable(exc: BaseException) -> bool:
    """Whether `exc` says Postgres cannot be used now (down, refusing, missing database, bad
    credentials, taking no writes), not that one statement failed (a lock or statement
    timeout is also an OperationalError, but the server answered)."""
    if isinstance(exc, sa.exc.DBAPIError) and exc.connection_invalidated:
        return True
    if not isinstance(exc, sa.exc.OperationalError | sa.exc.InterfaceError):
        return False
    sqlstate = getattr(exc.orig, "sqlstate", None)
    if sqlstate is None:  # libpq failed before the server said anything: no connection
        return True
    return str(sqlstate)[:2] in _UNREACHABLE_CLASSES or str(sqlstate) in _UNREACHABLE_CODES


def shown(url: str) -> str:
    """The URL with any password hidden, fit for messages and logs; a multi-host URL as libpq
    writes it (`user@h1:p1,h2:p2/db?...`)."""
    parsed = sa.make_url(url)
    hosts = parsed.query.get("host")
    if not isinstance(hosts, tuple):
        return str(parsed.render_as_string(hide_password=True))
    rest = parsed.difference_update_query(["host"]).set(host="HOSTS")
    return str(rest.render_as_string(hide_password=True)).replace("HOSTS", ",".join(hosts), 1)


def hosts(url: str) -> str:
    """Where `url` points, without user or password: `host:port/db`, or `h1:p1,h2:p2/db` for a
    multi-host URL."""
    parsed = sa.make_url(url)
    many = parsed.query.get("host")
    where = (
        ",".join(many)
        if isinstance(many, tuple)
        else f"{parsed.host or 'localhost'}:{parsed.port or 5432}"
    )
    return f"{where}/{parsed.database or ''}"


@dataclass(frozen=True)
class ConnectionLimits:
    """How many client connections the server takes, and how many it has now."""

    max_connections: int
    # Slots only superusers (and, from Postgres 16, roles with pg_use_reserved_connections) get.
    reserved: int
    in_use: int

    @property
    def for_clients(self) -> int:
        return self.max_connections - self.reserved


def connection_limits(url: str) -> ConnectionLimits:
    """The server's connection limits, read over one connection of its own (not a pool's, so
    the process's engine is still sized by whoever builds it)."""
    engine = sa.create_engine(
        url, poolclass=sa.pool.NullPool, hide_parameters=True, connect_args=dict(_LINK_OPTIONS)
    )
    try:
        with engine.connect() as conn:
            row = conn.execute(
                sql(
                    "SELECT current_setting('max_connections')::int AS max_connections, "
                    "current_setting('superuser_reserved_connections')::int + "
                    "coalesce(current_setting('reserved_connections', true), '0')::int "
                    "AS reserved, (SELECT count(*) FROM pg_stat_activity "
                    "WHERE backend_type = 'client backend') AS in_use"
                )
            ).one()
    finally:
        engine.dispose()
    return ConnectionLimits(row.max_connections, row.reserved, row.in_use)
