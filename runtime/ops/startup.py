"""What every engine process checks before it takes any work: its settings, its seal keys and
its tools; a worker also its database and its pool. A process that would fail every task
instead refuses to start, saying what to fix, with the exit code the CLI gives for the same
problem (liyagent/cli/common.py: 1 a database not migrated, 2 bad configuration, 3 Postgres or
Redis out of reach)."""

from __future__ import annotations

import re

import sqlalchemy as sa

from runtime.base import pools
from runtime.base.pools import WorkerPool
from runtime.base.redis_clients import check_reachable
from runtime.base.sealing import load_sealer
from runtime.base.settings import ConfigError, Settings, get_settings
from runtime.base.tracing import TracesUnavailable, check_installed
from runtime.core import catalog
from runtime.core.entry import entry_settings
from runtime.models import prices, profiles, specs
from runtime.models.base import ModelError
from runtime.recovery.outage import database_problem, schema_problem
from runtime.services import registry_for
from runtime.toolbox.tools import ToolDeclarationError
from store import db
from store.db import ConnectionLimits, connection_limits
from store.errors import LiyagentError

# The CLI's exit codes for the same problems.
NOT_READY, BAD_CONFIG, UNREACHABLE = 1, 2, 3

# Pools a worker runs under. gevent and eventlet run tasks as greenlets on one patched event
# loop, where an async tool fails ("Runner.run() cannot be called from a running event loop")
# while its run still ends `succeeded`: they are refused, as is any other pool.
SUPPORTED_POOLS = ("prefork", "threads", "solo")
_POOL_ALIASES = {"processes": "prefork"}


class StartupRefused(LiyagentError):
    """This process must not start; the message says what to fix, `code` is its exit code."""

    def __init__(self, message: str, code: int = BAD_CONFIG) -> None:
        super().__init__(message)
        self.code = code


def check(settings: Settings | None = None, *, database: bool = False) -> Settings:
    """The settings, with seal keys and tools loaded (and with `database`, Postgres answering);
    raises StartupRefused otherwise."""
    try:
        settings = settings or get_settings()
        load_sealer(settings.production)
        profiles.parse(settings.model_profiles)  # the model endpoints runs may use
        prices.parse(settings.model_prices)  # what their tokens cost
        registry_for(settings)
        entry_settings()  # each entry kind's own settings (Teams': LIYAGENT_TEAMS_*)
        check_reachable(settings)  # Sentinels that answer and know the master
        check_installed()  # traces asked for (OTEL_EXPORTER_OTLP_ENDPOINT) can be exported
    except (ConfigError, ToolDeclarationError, TracesUnavailable) as exc:
        raise StartupRefused(str(exc)) from None
    if database:
        check_database(settings.database_url, settings.database_pooler)
    elif settings.database_pooler is not db.Pooler.NONE:
        check_bounds_if_reached(settings.database_url, settings.database_pooler)
    return settings


def agent_problems(settings: Settings) -> list[str]:
    """What would fail every run of an agent this worker serves, one line per agent: a model
    endpoint its deployment does not declare, a key its worker does not have (the profile's
    variable unset, its file unreadable). Said once at start (a worker may still serve the
    other agents), naming the agent and what to set; never a key's value."""
    declared = profiles.parse(settings.model_profiles)
    try:
        found = catalog.load(settings.agents_file).with_agents(registry_for(settings).agents)
    except catalog.CatalogError as exc:
        return [f"the agent catalog cannot be read: {exc}"]
    said = []
    for name, agent in sorted(found.agents.items()):
        try:
            spec = specs.check(agent.model, declared)
            if isinstance(spec, specs.EndpointSpec):
                spec.endpoint(declared).key()
        except ModelError as exc:
            said.append(f"agent {name} ({agent.origin}): its runs will fail: {exc}")
    return said


def check_database(url: str, pooler: db.Pooler = db.Pooler.NONE) -> None:
    """Postgres at `url` (behind `pooler`) answers and holds the schema, and behind a pooler
    gives the role the session bounds (`bounds_problem`); StartupRefused with the CLI's
    sentence and exit code otherwise (3 out of reach, 1 not migrated, 2 no bounds). The
    probe's engine is its own and is closed, so no pool child inherits its socket."""
    engine = db.create(url, pool_max=1, pooler=pooler)
    try:
        db.ping_schema(engine)
        if pooler is not db.Pooler.NONE:
            _refuse_without_bounds(engine, pooler)
    except sa.exc.ProgrammingError as exc:  # created, never migrated: every claim would fail
        raise StartupRefused(schema_problem(exc), NOT_READY) from None
    except sa.exc.SQLAlchemyError as exc:
        if not db.unreachable(exc):
            raise
        raise StartupRefused(database_problem(exc, url), UNREACHABLE) from None
    finally:
        engine.dispose()


def check_bounds_if_reached(url: str, pooler: db.Pooler) -> None:
    """For a process that starts without its database (beat, the front): behind a pooler, the
    role's session bounds, when Postgres answers now (StartupRefused without them); out of
    reach, it starts as it would anyway, its statements waiting for Postgres."""
    engine = db.create(url, pool_max=1, pooler=pooler)
    try:
        _refuse_without_bounds(engine, pooler)
    except sa.exc.SQLAlchemyError as exc:
        if not db.unreachable(exc):
            raise
    finally:
        engine.dispose()


def _refuse_without_bounds(engine: sa.Engine, pooler: db.Pooler) -> None:
    role, found = db.session_bounds(engine)
    problem = bounds_problem(pooler, role, str(engine.url.database or ""), found)
    if problem is not None:
        raise StartupRefused(problem)


def bounds_problem(
    pooler: db.Pooler, role: str, database: str, found: dict[str, int]
) -> str | None:
    """Why a process behind `pooler` must not start (None when it may): a session of `role`
    lacks a bound a direct link sets at connect (db.SESSION_BOUNDS_MS; 0 is none), or has one
    looser. A pooler hands each statement whichever server session is free, so what the link
    asked of its own session at connect (startup options: refused by PgBouncer) must be what
    every session of the role starts with; a stalled client could otherwise hold a row lock
    the sweeper waits on without end."""
    wrong = {
        name: found.get(name, 0)
        for name, bound in db.SESSION_BOUNDS_MS.items()
        if not 0 < found.get(name, 0) <= bound
    }
    if not wrong:
        return None
    said = ", ".join(f"{name}={ms or 'none'}" for name, ms in wrong.items())
    fix = "; ".join(
        f"ALTER ROLE {_ident(role)} IN DATABASE {_ident(database)} "
        f"SET {name} = {db.SESSION_BOUNDS_MS[name]}"
        for name in wrong
    )
    return (
        f"LIYAGENT_DATABASE_POOLER={pooler.value}: the pooler passes no session options, so "
        f"the server must bound every session of role {role} itself, and it gives {said} "
        f"(at most {_bounds_said()} wanted, in ms). Set them on the server ({fix}), or in the "
        "pooler's connect_query for this database; then have the pooler open new server "
        "sessions (PgBouncer: RECONNECT in its admin console) and start again"
    )


def _ident(name: str) -> str:
    """`name` as SQL writes it: plain when it is a lower-case identifier, quoted otherwise."""
    if re.fullmatch(r"[a-z_][a-z0-9_$]*", name):
        return name
    return '"' + name.replace('"', '""') + '"'


def _bounds_said() -> str:
    return ", ".join(f"{name}={ms}" for name, ms in db.SESSION_BOUNDS_MS.items())


def check_pool(name: str) -> None:
    """A worker's pool (Celery's name for it) is one the engine supports; StartupRefused
    otherwise, naming the supported ones."""
    name = _POOL_ALIASES.get(name, name)
    if name not in SUPPORTED_POOLS:
        raise StartupRefused(
            f"the {name} pool is not supported (async tools fail under it); start the worker "
            "with -P prefork (the default), -P threads or -P solo"
        )


def queue_warning(consumed: list[str], queue: str) -> str | None:
    """What to say when a worker does not consume the runs' queue (LIYAGENT_QUEUE), else None.
    A worker of the deployment's periodic work only (`-Q <queue>.ops`) is meant so: silent."""
    if queue in consumed or set(consumed) == {f"{queue}.ops"}:
        return None
    return (
        f"this worker consumes {', '.join(consumed) or 'no queue'} but not {queue}, the queue "
        f"runs are published to (LIYAGENT_QUEUE={queue}): it takes no runs; add {queue} to -Q, "
        "or give it the LIYAGENT_QUEUE the other processes have"
    )


def check_connections(settings: Settings, pool: WorkerPool) -> str | None:
    """Refuse a worker whose pool the connection pools or Postgres's `max_connections` cannot
    serve, naming the numbers and what to set, instead of failing its runs later; returns a
    warning when the server is only short of free connections right now, or could not be
    asked. Behind a pooler nothing is checked: the worker's connections are the pooler's
    clients (its `max_client_conn` bounds them), never the server's."""
    if settings.database_pooler is not db.Pooler.NONE:
        return None
    try:
        limits = connection_limits(settings.database_url)
    except sa.exc.SQLAlchemyError as exc:
        # Whether a worker starts without its database is the reachability check's to say;
        # this one can only not be made.
        return (
            f"Postgres ({db.hosts(settings.database_url)}) could not be asked for its connection "
            f"limits ({type(exc).__name__}): {pool.describe()} was not checked against them"
        )
    refusal = connection_refusal(settings, pool, limits)
    if refusal is not None:
        raise StartupRefused(refusal)
    free = limits.for_clients - limits.in_use
    if pools.at_once(pool, settings.db_pool_max) > free:
        return (
            f"{pool.describe()} can open {pools.at_once(pool, settings.db_pool_max)} Postgres "
            f"connections at once and the server has {free} free now ({limits.in_use} of "
            f"{limits.for_clients} in use): statements wait for a connection while it is full"
        )
    return None


def connection_refusal(
    settings: Settings, pool: WorkerPool, limits: ConnectionLimits
) -> str | None:
    """Why this worker cannot be served (None when it can): a Redis pool bound under what its
    threads need (redis-py fails a command at once when its pool is used up, where the
    database pool lets a thread wait its turn), or more Postgres connections at once than the
    server takes at all (a prefork worker's children, an explicit LIYAGENT_DB_POOL_MAX, or the
    thread pool's default bound on a server smaller than a stock one)."""
    need = pool.threads + pools.MAIN_THREADS
    if pool.threads > 1 and 0 < settings.redis_pool_max < need:
        return (
            f"LIYAGENT_REDIS_POOL_MAX={settings.redis_pool_max} is under what "
            f"{pool.describe()} needs: {need} connections (one per task thread inside a "
            f"command, {pools.MAIN_THREADS} for the main process's own threads), and a Redis "
            "pool that is used up fails the command; unset it (it follows -c) or set it to "
            f"{need} or more"
        )
    at_once = pools.at_once(pool, settings.db_pool_max)
    if at_once <= limits.for_clients:
        return None
    fix = f"lower -c to {limits.for_clients - pools.MAIN_THREADS} or less"
    who = pool.describe()
    if pool.name in pools.IN_PROCESS:
        fix = (
            f"set LIYAGENT_DB_POOL_MAX to at most {limits.for_clients}, less what other "
            "processes use (the threads then take turns: each holds a connection for one "
            "statement only)"
        )
        if settings.db_pool_max:
            who = f"{who} with LIYAGENT_DB_POOL_MAX={settings.db_pool_max}"
        else:
            who = (
                f"{who} (LIYAGENT_DB_POOL_MAX unset: one per thread and "
                f"{pools.MAIN_THREADS} more, at most {pools.THREADS_DB_POOL_DEFAULT})"
            )
    return (
        f"{who} can open {at_once} Postgres connections at once, more than the server takes: "
        f"max_connections={limits.max_connections}, {limits.reserved} of them reserved for "
        f"superusers, so {limits.for_clients} for clients (and {limits.in_use} in use now). "
        f"Either {fix}, or raise max_connections on the server"
    )
