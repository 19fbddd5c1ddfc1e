"""Postgres and Redis for the demo: the configured URLs, the machine's servers, or private ones.

What the demo creates it also removes (its Redis namespace, private servers); the database it
makes on a shared server is kept, so a resumed run can still be inspected afterwards.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import redis
import sqlalchemy as sa
import structlog

from liyagent.local.secret_file import url_shown
from liyagent.local.servers import PrivatePostgres, PrivateRedis, pg_bin, reachable
from runtime.base.redis_clients import RedisTarget, client_for
from runtime.base.settings import ConfigError, redis_master, redis_url
from store import admin, migrate

log = structlog.get_logger(__name__)

MACHINE_PG_ADMIN = "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"
MACHINE_REDIS = "redis://127.0.0.1:6379/0"
INSTALL_HINT = (
    "install them and run the demo again: `sudo apt install postgresql redis-server` "
    "(Debian/Ubuntu), `sudo dnf install postgresql-server redis` (Fedora) or "
    "`brew install postgresql redis` (macOS); or point the demo at running servers with "
    "LIYAGENT_DATABASE_URL and LIYAGENT_REDIS_URL"
)


class DemoError(RuntimeError):
    """The demo cannot go on; the message says why and what to do, `exit_code` for scripts."""

    def __init__(self, message: str, exit_code: int = 1) -> None:
        super().__init__(message)
        self.exit_code = exit_code


@dataclass
class Backends:
    """Where the demo's data lives, and what it must clean up when it ends."""

    database_url: str = ""
    redis_url: str = ""
    # With a sentinel:// `redis_url`: the master's name (LIYAGENT_REDIS_MASTER).
    redis_master: str = ""
    namespace: str = ""
    # The database the demo created on a server it did not start (kept for `inspect`).
    created_database: str | None = None
    private: list[PrivatePostgres | PrivateRedis] = field(default_factory=list)
    private_dir: Path | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def private_postgres(self) -> bool:
        """Whether the runs live in a private Postgres that is removed at the end."""
        return any(isinstance(s, PrivatePostgres) for s in self.private)


def safe_url(url: str) -> str:
    """The URL with any password masked, for messages."""
    return str(sa.make_url(url).render_as_string(hide_password=True))


def _with_db(url: str, name: str) -> str:
    return str(sa.make_url(url).set(database=name).render_as_string(hide_password=False))


def _private_dir(b: Backends) -> Path:
    if b.private_dir is None:
        b.private_dir = Path(tempfile.mkdtemp(prefix="liyagent-demo-servers-"))
        b.private_dir.chmod(0o755)  # Postgres runs as its own user when we are root
    return b.private_dir


def recreate_database(admin_url: str, name: str) -> None:
    """Drop `name` if it exists (closing its sessions) and create it empty."""
    try:
        admin.recreate_database(admin_url, name)
    except admin.BadDatabaseName as exc:
        raise DemoError(str(exc), exit_code=2) from None


def _check_postgres(url: str, advice: str) -> None:
    """Connect once to `url`; exit 3 with `advice` if Postgres refuses."""
    engine = sa.create_engine(url, hide_parameters=True, connect_args={"connect_timeout": 5})
    try:
        with engine.connect():
            pass  # connecting is the whole check
    except sa.exc.OperationalError as exc:
        raise DemoError(
            f"cannot use Postgres at {safe_url(url)} ({str(exc.orig).strip()}); {advice}",
            exit_code=3,
        ) from None
    finally:
        engine.dispose()


def _start_private_postgres(b: Backends) -> str:
    """initdb and start a throwaway cluster; exit 3 with install steps if it cannot."""
    try:
        pg_bin("initdb")
        pg_bin("pg_ctl")
    except RuntimeError:
        raise DemoError(
            "no Postgres answers at 127.0.0.1:5432 and its binaries (initdb, pg_ctl) are not "
            f"installed: {INSTALL_HINT}",
            exit_code=3,
        ) from None
    server = PrivatePostgres(_private_dir(b) / "pg")
    b.private.append(server)
    try:
        server.init().start()
    except subprocess.CalledProcessError as exc:
        why = (exc.stderr or b"").decode(errors="replace").strip()[-500:]
        raise DemoError(f"could not start a private Postgres: {why}", exit_code=3) from None
    b.notes.append(f"Postgres: a private server on port {server.port}")
    return server.url


def _postgres(b: Backends, db_name: str, force_private: bool) -> None:
    """Pick the Postgres (configured, the machine's, or private), make the database, migrate."""
    configured = os.environ.get("LIYAGENT_DATABASE_URL")
    if configured and not force_private:
        _check_postgres(configured, "start it, or fix or unset LIYAGENT_DATABASE_URL")
        b.database_url = configured
        b.notes.append(f"Postgres: {safe_url(configured)} (LIYAGENT_DATABASE_URL)")
    else:
        if not force_private and reachable("127.0.0.1", 5432):
            admin = MACHINE_PG_ADMIN
            _check_postgres(
                admin, "set LIYAGENT_DATABASE_URL to a server and database the demo may use"
            )
            b.notes.append(f"Postgres: this machine's at 127.0.0.1:5432, database {db_name}")
            b.created_database = db_name
        else:
            admin = _start_private_postgres(b)
        recreate_database(admin, db_name)
        b.database_url = _with_db(admin, db_name)
    migrate.upgrade(b.database_url)


def _check_redis(target: RedisTarget) -> None:
    """Ping Redis (through its Sentinels, if it has them); exit 3 if it does not answer."""
    client = client_for(target, socket_connect_timeout=3, socket_timeout=3)
    try:
        client.ping()
    except redis.exceptions.RedisError as exc:
        raise DemoError(
            f"cannot reach Redis at {target.describe()} ({exc}); start it, or fix or unset "
            "LIYAGENT_REDIS_URL",
            exit_code=3,
        ) from None
    finally:
        client.close()


def _redis(b: Backends, force_private: bool) -> None:
    """Pick the Redis (configured, the machine's, or private) and check it answers."""
    configured = os.environ.get("LIYAGENT_REDIS_URL")
    if configured and not force_private:
        b.redis_url = configured
        try:  # a Sentinel URL needs its master's name
            b.redis_master = redis_master(
                redis_url(configured), os.environ.get("LIYAGENT_REDIS_MASTER", "")
            )
        except ConfigError as exc:
            raise DemoError(str(exc), exit_code=2) from None
        b.notes.append(f"Redis: {url_shown(configured)} (LIYAGENT_REDIS_URL)")
    elif not force_private and reachable("127.0.0.1", 6379):
        b.redis_url = MACHINE_REDIS
        b.notes.append("Redis: this machine's at 127.0.0.1:6379")
    else:
        if not shutil.which("redis-server"):
            raise DemoError(
                f"no Redis answers at 127.0.0.1:6379 and redis-server is not installed: "
                f"{INSTALL_HINT}",
                exit_code=3,
            )
        server = PrivateRedis(_private_dir(b) / "redis")
        b.private.append(server)
        try:
            server.start()
        except subprocess.CalledProcessError as exc:
            raise DemoError(f"could not start a private Redis: {exc}", exit_code=3) from None
        b.redis_url = server.url
        b.notes.append(f"Redis: a private server on port {server.port}")
    _check_redis(RedisTarget(b.redis_url, b.redis_master))
    b.notes.append(f"Redis key namespace: {b.namespace} (deleted at the end)")


def open_backends(b: Backends, db_name: str, force_private: bool = False) -> Backends:
    """Fill `b` with reachable servers and a migrated database; the caller closes it even if
    this raises, so a half-started private server is never left behind."""
    _postgres(b, db_name, force_private)
    _redis(b, force_private)
    return b


def close_backends(b: Backends) -> None:
    """Delete the demo's Redis keys and stop and remove any private server."""
    if b.redis_url and b.namespace:
        with contextlib.suppress(redis.exceptions.RedisError):
            client = client_for(RedisTarget(b.redis_url, b.redis_master), socket_timeout=3)
            keys = list(client.scan_iter(match=f"{b.namespace}*", count=1000))
            if keys:
                client.delete(*keys)
            client.close()
    for server in reversed(b.private):
        server.stop()
    if b.private_dir is not None:
        shutil.rmtree(b.private_dir, ignore_errors=True)
    log.info("demo.backends_closed", namespace=b.namespace, private=len(b.private))
