"""The bench's own servers and processes: a private Postgres (pg_stat_statements preloaded) and
private Redis servers, databases cloned from one migrated template, the vendor simulators, and
real `celery` workers (liyagent's and the plain-Celery baseline's).

Everything is started under one `Lab` and removed by `Lab.close`, which `open_lab` calls on any
way out (an error, Ctrl-C, SIGTERM). Nothing touches the machine's shared Postgres or Redis.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path

import redis
import sqlalchemy as sa

from liyagent.local import sim_model
from liyagent.local.cluster import APP, START_TIMEOUT_S, Cluster, child_env, worker_argv
from liyagent.local.procs import Proc, sigterm_as_interrupt
from liyagent.local.servers import PrivatePostgres, PrivateRedis
from runtime.base import logs
from runtime.base.sealing import new_key_entry
from runtime.base.settings import Settings, Timings
from store import admin, migrate

# Liyagent's own settings are cleared for the bench: it never fills a configured database.
SERVER_VARS = ("LIYAGENT_DATABASE_URL", "LIYAGENT_REDIS_URL")
TEMPLATE_DB = "bench_template"
# Production's durability (the default), or the test clusters' (fsync off: faster, unsafe).
DURABLE = {"fsync": "on", "synchronous_commit": "on", "full_page_writes": "on"}
NOT_DURABLE = {"fsync": "off", "synchronous_commit": "off", "full_page_writes": "off"}


def pg_settings(durable: bool) -> dict[str, str]:
    """The private Postgres's settings: statement statistics, and the durability asked for."""
    return {
        "shared_preload_libraries": "pg_stat_statements",
        "pg_stat_statements.track": "top",
        "pg_stat_statements.track_utility": "on",
        "pg_stat_statements.max": "10000",
        "max_connections": "400",
        **(DURABLE if durable else NOT_DURABLE),
    }


class LabError(RuntimeError):
    """The bench cannot start its servers; the message says what to install or fix."""


@dataclass(frozen=True)
class WorkerSpec:
    """One worker to start: its name, queue, environment and Celery app module."""

    name: str
    queue: str
    env: dict[str, str]
    app: str = APP


@dataclass
class Lab:
    """One bench session's servers, databases and processes."""

    durable: bool = True
    base: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="liyagent-bench-")))
    pg: PrivatePostgres | None = None
    redis_servers: list[PrivateRedis] = field(default_factory=list)
    cluster: Cluster = field(init=False)
    seal_keys: str = field(default_factory=lambda: new_key_entry("bench"))
    sim_url: str = ""
    sim_db_url: str = ""
    _databases: list[str] = field(default_factory=list)
    # Servers that hold only a simulator's records (`apart_simulator`).
    record_pgs: list[PrivatePostgres] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.base.chmod(0o755)  # Postgres runs as its own user when we are root
        (self.base / "logs").mkdir(exist_ok=True)
        self.cluster = Cluster(self.base / "logs")

    # -- servers ---------------------------------------------------------------------------

    def start(self) -> Lab:
        """Start Postgres and the main Redis, migrate the template, start the simulators;
        LabError says what is missing when a server cannot start."""
        self.pg = PrivatePostgres(self.base / "pg", settings=pg_settings(self.durable))
        try:
            self.pg.init().start()
        except RuntimeError as exc:  # initdb or pg_ctl not installed
            raise LabError(str(exc)) from None
        except subprocess.CalledProcessError as exc:
            why = (exc.stderr or b"").decode(errors="replace").strip()[-400:]
            log = self.pg.base / "pg.log"
            tail = log.read_text(errors="replace")[-400:] if log.exists() else ""
            raise LabError(f"the private Postgres did not start: {why} {tail}".strip()) from None
        try:
            with self.admin() as conn:
                conn.execute(sa.text("CREATE EXTENSION IF NOT EXISTS pg_stat_statements"))
        except sa.exc.SQLAlchemyError as exc:
            raise LabError(
                f"pg_stat_statements is not available ({str(getattr(exc, 'orig', exc)).strip()}): "
                "install PostgreSQL's contrib modules (Debian: postgresql-contrib)"
            ) from None
        admin.create_database(self.pg.url, TEMPLATE_DB)
        migrate.upgrade(admin.database_url(self.pg.url, TEMPLATE_DB))
        try:
            self.redis_url = self.new_redis()
        except (RuntimeError, subprocess.CalledProcessError) as exc:
            raise LabError(f"the private Redis did not start: {exc}") from None
        self.sim_db_url = self.database("bench_sim", migrated=False)
        self.sim_url = self.cluster.simulator(self.sim_db_url, self._base_env())
        return self

    @property
    def admin_url(self) -> str:
        assert self.pg is not None, "the lab is not started"
        return self.pg.url

    @contextlib.contextmanager
    def admin(self) -> Iterator[sa.Connection]:
        """An autocommit connection to the `postgres` database (the bench's observer)."""
        engine = sa.create_engine(
            self.admin_url, isolation_level="AUTOCOMMIT", hide_parameters=True
        )
        try:
            with engine.connect() as conn:
                yield conn
        finally:
            engine.dispose()

    def new_redis(self) -> str:
        """Another private Redis (its own INFO counters); its URL."""
        server = PrivateRedis(self.base / f"redis-{len(self.redis_servers)}")
        self.redis_servers.append(server)
        server.start()
        return server.url

    def database(self, prefix: str, migrated: bool = True) -> str:
        """A new database (a clone of the migrated template, or empty); its URL."""
        name = f"{prefix}_{uuid.uuid4().hex[:8]}"
        admin.create_database(self.admin_url, name, TEMPLATE_DB if migrated else None)
        self._databases.append(name)
        return admin.database_url(self.admin_url, name)

    def apart_simulator(self) -> tuple[str, int]:
        """Another vendor simulator whose records go to a Postgres of its own (removed with the
        lab): what it records never lands on the lab's Postgres, so a section can charge all
        of that server's work to liyagent. Its base URL and process id."""
        n = len(self.record_pgs)
        pg = PrivatePostgres(self.base / f"pg-records-{n}", settings=NOT_DURABLE)
        self.record_pgs.append(pg)
        pg.init().start()
        admin.create_database(pg.url, "records")
        url = admin.database_url(pg.url, "records")
        name = f"simulator-apart-{n}"
        base_url = self.cluster.simulator(url, self._base_env(), name)
        return base_url, self.cluster.procs[name].popen.pid

    # -- processes -------------------------------------------------------------------------

    def settings(
        self, database_url: str, redis_url: str | None = None, **changes: object
    ) -> Settings:
        """A liyagent deployment's settings on these servers, with the product's timings."""
        base = Settings(
            database_url=database_url,
            redis_url=redis_url or self.redis_url,
            namespace=f"bench:{uuid.uuid4().hex[:8]}:",
            queue=f"bench-{uuid.uuid4().hex[:8]}",
            vendor_url=self.sim_url,
            model_profiles=sim_model.profiles(self.sim_url),
            tool_modules=sim_model.TOOLS,
            timings=Timings(),
        )
        return replace(base, **changes)  # type: ignore[arg-type]

    def _base_env(self) -> dict[str, str]:
        return child_env(Settings(), self.seal_keys)

    def liyagent(self, name: str, settings: Settings) -> WorkerSpec:
        """A liyagent worker (`celery -A liyagent.worker worker`) on these settings' run queue."""
        return WorkerSpec(name, settings.queue, child_env(settings, self.seal_keys))

    def baseline(
        self, name: str, database_url: str, redis_url: str, namespace: str, queue: str
    ) -> WorkerSpec:
        """A worker of the plain-Celery baseline app (bench/baseline.py)."""
        env = {
            **self._base_env(),
            "BENCH_BASELINE_BROKER": redis_url,
            "BENCH_BASELINE_NAMESPACE": namespace,
            "BENCH_BASELINE_QUEUE": queue,
            "BENCH_BASELINE_DATABASE_URL": database_url,
            "BENCH_VENDOR_URL": self.sim_url,
        }
        return WorkerSpec(name, queue, env, app="bench.baseline")

    def launch(self, *specs: WorkerSpec, concurrency: int = 2, pool: str = "prefork") -> list[Proc]:
        """Start these real workers (`-P pool`) at once, then wait until each is ready."""
        procs = []
        for spec in specs:
            argv = worker_argv(spec.name, spec.queue, concurrency, spec.app, pool)
            proc = Proc(spec.name, argv, spec.env, self.cluster.log_dir / f"{spec.name}.log")
            self.cluster.procs[spec.name] = proc
            self.cluster.pids.add(proc.popen.pid)
            procs.append(proc)
        for proc in procs:
            proc.wait_for(r"ready\.", timeout=START_TIMEOUT_S)
        return procs

    def stop(self, *procs: Proc) -> None:
        """Stop these processes cleanly, together (SIGTERM to each group at once, then each is
        waited for and SIGKILLed if it outlives the grace)."""
        for proc in procs:
            if proc.alive():
                proc.signal_group(signal.SIGTERM)
        for proc in procs:
            proc.stop(grace_s=10.0)
        self.cluster.procs = {k: v for k, v in self.cluster.procs.items() if v not in procs}

    def close(self) -> None:
        """Stop every process and server and delete their files."""
        with contextlib.suppress(Exception):
            self.cluster.stop()
        for server in self.redis_servers:
            server.stop()
        for pg in self.record_pgs:
            pg.remove()
        if self.pg is not None:
            self.pg.remove()
        import shutil

        shutil.rmtree(self.base, ignore_errors=True)


def redis_client(url: str) -> redis.Redis[bytes]:
    return redis.Redis.from_url(url, socket_timeout=10)


def quiet_logs() -> None:
    """Engine logs of this process go to stderr, warnings only, so stdout holds the figures;
    configured servers are ignored (the bench makes its own)."""
    logs.configure(level="WARNING")
    ignored = [name for name in SERVER_VARS if os.environ.pop(name, None)]
    if ignored:
        print(f"(ignoring {', '.join(ignored)}: the bench uses its own servers)", file=sys.stderr)


@contextlib.contextmanager
def open_lab(durable: bool = True) -> Iterator[Lab]:
    """A started lab, closed on every way out (SIGTERM is treated as Ctrl-C)."""
    quiet_logs()
    lab = Lab(durable=durable)
    with sigterm_as_interrupt():
        try:
            yield lab.start()
        finally:
            lab.close()
