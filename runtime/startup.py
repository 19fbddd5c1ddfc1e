"""What every engine process checks before it takes any work: its settings, its seal keys and
its tools. A process that would fail every task instead refuses to start, saying what to fix."""

from __future__ import annotations

import sqlalchemy as sa

from runtime import pools
from runtime.pools import WorkerPool
from runtime.sealing import load_sealer
from runtime.services import registry_for
from runtime.settings import ConfigError, Settings, get_settings
from runtime.tools import ToolDeclarationError
from store.db import ConnectionLimits, connection_limits


class StartupRefused(Exception):
    """This process must not start; the message says what to fix."""


def check(settings: Settings | None = None) -> Settings:
    """The settings, with seal keys and tools loaded; raises StartupRefused otherwise."""
    try:
        settings = settings or get_settings()
        load_sealer(settings.production)
        registry_for(settings)
    except (ConfigError, ToolDeclarationError) as exc:
        raise StartupRefused(str(exc)) from None
    return settings


def check_connections(settings: Settings, pool: WorkerPool) -> str | None:
    """Refuse a worker whose pool the connection pools or Postgres's `max_connections` cannot
    serve, naming the numbers and what to set, instead of failing its runs later; returns a
    warning when the server is only short of free connections right now, or could not be
    asked."""
    try:
        limits = connection_limits(settings.database_url)
    except sa.exc.SQLAlchemyError as exc:
        # Whether a worker starts without its database is the reachability check's to say;
        # this one can only not be made.
        return (
            f"Postgres ({_where(settings.database_url)}) could not be asked for its connection "
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
    server takes at all."""
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
    if at_once > limits.for_clients:
        most = limits.for_clients - pools.MAIN_THREADS
        fix = f"lower -c to {most} or less, or raise max_connections on the server"
        if pool.threads > 1:
            fix = (
                f"set LIYAGENT_DB_POOL_MAX to at most {limits.for_clients}, less what other "
                "processes use (the threads then take turns: each holds a connection for one "
                f"statement only), {fix}"
            )
        return (
            f"{pool.describe()} can open {at_once} Postgres connections at once, more than "
            f"the server takes: max_connections={limits.max_connections}, {limits.reserved} "
            f"of them reserved for superusers, so {limits.for_clients} for clients (and "
            f"{limits.in_use} in use now). Either {fix}"
        )
    return None


def _where(url: str) -> str:
    parsed = sa.make_url(url)
    return f"{parsed.host or 'localhost'}:{parsed.port or 5432}/{parsed.database or ''}"
