"""A private PgBouncer (Debian's package) in transaction pooling on a free loopback port, in
front of the suite's Postgres, and the server-side bounds a pooled deployment sets on its role
(or here on the test's database): the stack of tests/integration/store/test_pgbouncer.py.

Without the binary the tests skip, unless LIYAGENT_CI is set (.ci/run sets it and installs
the package): there a missing PgBouncer is a failure, never a silent skip."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest
import sqlalchemy as sa

from liyagent.local.procs import Proc
from liyagent.local.servers import free_port
from store.db import SESSION_BOUNDS_MS

# Where Debian's package puts it (not on a non-root PATH).
BINARY = "/usr/sbin/pgbouncer"
PORT_TRIES = 5


def pgbouncer_binary() -> str:
    """PgBouncer's binary, or skip (fail under LIYAGENT_CI) when it is not installed."""
    found = shutil.which("pgbouncer") or (BINARY if Path(BINARY).exists() else None)
    if found is None:
        why = "PgBouncer is not installed (apt install pgbouncer)"
        if os.environ.get("LIYAGENT_CI"):
            pytest.fail(f"{why}, and CI must have it (.ci/run installs it)")
        pytest.skip(why)
    return found


class PrivatePgBouncer:
    """PgBouncer in transaction pooling before the Postgres at `server_host:server_port`: every
    database name a client asks for is pooled to the same name there (`* =`), at most
    `pool_size` server sessions a database (fewer than its clients, so statements of different
    clients share sessions, which is what breaks a session's state), `max_clients` clients in
    all. Trust auth for `user`, as the suite's Postgres has. No startup parameter is ignored:
    a client that sends `options` is refused, as by a stock installation."""

    def __init__(
        self,
        server_host: str,
        server_port: int,
        *,
        user: str = "postgres",
        pool_size: int = 8,
        max_clients: int = 400,
    ) -> None:
        self.server = (server_host, server_port)
        self.user = user
        self.pool_size = pool_size
        self.max_clients = max_clients
        # PgBouncer refuses to run as root: as root it runs as `postgres`, which must read here.
        self.base = Path(tempfile.mkdtemp(prefix="liyagent-pgbouncer-"))
        self.base.chmod(0o755)
        self.port = 0
        self.proc: Proc | None = None

    def url(self, database: str) -> str:
        return f"postgresql+psycopg://{self.user}@127.0.0.1:{self.port}/{database}"

    def start(self) -> PrivatePgBouncer:
        """Start it on a free port (another one if that was taken meanwhile) and wait until it
        listens."""
        binary = pgbouncer_binary()
        for attempt in range(1, PORT_TRIES + 1):
            self.port = free_port()
            ini = self._write_config()
            argv = [binary, str(ini)]
            if os.geteuid() == 0:
                argv = ["runuser", "-u", "postgres", "--", *argv]
            log = self.base / f"pgbouncer-{attempt}.log"
            self.proc = Proc("pgbouncer", argv, dict(os.environ), log)
            try:
                self.proc.wait_for(rf"listening on 127\.0\.0\.1:{self.port}", timeout=15)
                return self
            except AssertionError:
                self.proc.kill()
                if "Address already in use" not in log.read_text() or attempt == PORT_TRIES:
                    raise
        raise AssertionError("unreachable")

    def _write_config(self) -> Path:
        users = self.base / "users.txt"
        users.write_text(f'"{self.user}" ""\n')
        host, port = self.server
        ini = self.base / "pgbouncer.ini"
        ini.write_text(
            "[databases]\n"
            f"* = host={host} port={port}\n"
            "[pgbouncer]\n"
            "listen_addr = 127.0.0.1\n"
            f"listen_port = {self.port}\n"
            "unix_socket_dir =\n"
            "auth_type = trust\n"
            f"auth_file = {users}\n"
            "pool_mode = transaction\n"
            f"default_pool_size = {self.pool_size}\n"
            f"max_client_conn = {self.max_clients}\n"
        )
        for path in (users, ini):
            path.chmod(0o644)
        return ini

    def log(self) -> str:
        return self.proc.output() if self.proc is not None else ""

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.kill()
        shutil.rmtree(self.base, ignore_errors=True)


def bound_sessions(admin_url: str, database: str) -> None:
    """Give every new session of `database` the bounds a direct link sets at connect
    (store/db.py `SESSION_BOUNDS_MS`), as a pooled deployment sets them on its role: here on
    the test's own database, so no other test's sessions change."""
    engine = sa.create_engine(admin_url, isolation_level="AUTOCOMMIT", hide_parameters=True)
    try:
        with engine.connect() as conn:
            for name, ms in SESSION_BOUNDS_MS.items():
                conn.execute(sa.text(f"ALTER DATABASE {database} SET {name} = {int(ms)}"))
    finally:
        engine.dispose()


def renew_sessions(admin_url: str, database: str) -> None:
    """End every server session of `database` (the pooler's among them): the pooler opens
    new ones, which start with the database's settings as they are now."""
    engine = sa.create_engine(admin_url, isolation_level="AUTOCOMMIT", hide_parameters=True)
    try:
        with engine.connect() as conn:
            conn.execute(
                sa.text(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                    "WHERE datname = :d AND pid <> pg_backend_pid()"
                ),
                {"d": database},
            )
    finally:
        engine.dispose()
