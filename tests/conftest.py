"""Test set-up: real Postgres and Redis (a private Postgres per test process, the machine's
Redis), a migrated template database cloned per test, a Redis namespace per test, and the
vendor simulator as a real process."""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
import sqlalchemy as sa

from liyagent.local.procs import Proc, python
from liyagent.local.servers import PrivatePostgres, PrivateRedis, reachable
from liyagent.local.sim_model import profiles as sim_profiles
from liyagent.local.verdict import measured_commit
from runtime.base.sealing import new_key_entry, parse_keys
from runtime.base.settings import Settings
from store import migrate
from store.admin import create_database, drop_database
from tests.support.stack import FAST, SIM_MODEL_KEY, SIM_MODEL_KEY_ENV, TOOLS, Stack

DEFAULT_PG = "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"
DEFAULT_REDIS = "redis://127.0.0.1:6379/0"


def _with_db(url: str, name: str) -> str:
    return str(sa.make_url(url).set(database=name).render_as_string(hide_password=False))


def _host_port(url: str, default_port: int) -> tuple[str, int]:
    u = sa.make_url(url.replace("redis://", "postgresql://"))
    return u.host or "127.0.0.1", u.port or default_port


@pytest.fixture(scope="session")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    """Admin URL of the test process's Postgres and URL of a reachable Redis.

    Postgres is a private server of this test process (fsync off, max_connections 300) unless
    LIYAGENT_TEST_PG_ADMIN_URL names one: the suite's test processes each start workers and
    simulators at once, and together they took the machine's server (max_connections 100) to
    within a few connections of its limit, and past it once ('too many clients already'). The
    machine's is used when no server binaries are installed. Redis is the machine's (or a
    private one if it does not answer)."""
    pg = os.environ.get("LIYAGENT_TEST_PG_ADMIN_URL")
    rd = os.environ.get("LIYAGENT_TEST_REDIS_URL", DEFAULT_REDIS)
    started: list[PrivatePostgres | PrivateRedis] = []
    if pg is None:
        try:
            private_pg = PrivatePostgres().init().start()
        except RuntimeError:  # initdb or pg_ctl not installed: the machine's server
            pg = DEFAULT_PG
        else:
            started.append(private_pg)
            pg = private_pg.url
    if not reachable(*_host_port(pg, 5432)):
        private_pg = PrivatePostgres().init().start()
        started.append(private_pg)
        pg = private_pg.url
    if not reachable(*_host_port(rd, 6379)):
        private_redis = PrivateRedis(tmp_path_factory.mktemp("redis")).start()
        started.append(private_redis)
        rd = private_redis.url
    yield pg, rd
    for server in started:
        if isinstance(server, PrivatePostgres):
            server.remove()
        else:
            server.stop()


@pytest.fixture(scope="session")
def admin_engine(servers: tuple[str, str]) -> Iterator[sa.Engine]:
    engine = sa.create_engine(servers[0], isolation_level="AUTOCOMMIT", hide_parameters=True)
    yield engine
    engine.dispose()


def _create_db(admin: sa.Engine, name: str, template: str | None = None) -> None:
    create_database(admin.url.render_as_string(hide_password=False), name, template)


def _drop_db(admin: sa.Engine, name: str) -> None:
    drop_database(admin.url.render_as_string(hide_password=False), name)


@pytest.fixture(scope="session")
def session_tag() -> str:
    return uuid.uuid4().hex[:10]


@pytest.fixture(scope="session")
def template_db(
    admin_engine: sa.Engine, servers: tuple[str, str], session_tag: str
) -> Iterator[str]:
    """A database migrated to head once per session; each test clones it."""
    name = f"lyt_tpl_{session_tag}"
    _create_db(admin_engine, name)
    migrate.upgrade(_with_db(servers[0], name))
    yield name
    _drop_db(admin_engine, name)


@pytest.fixture
def db_url(admin_engine: sa.Engine, servers: tuple[str, str], template_db: str) -> Iterator[str]:
    name = f"lyt_{uuid.uuid4().hex[:16]}"
    _create_db(admin_engine, name, template=template_db)
    yield _with_db(servers[0], name)
    _drop_db(admin_engine, name)


@pytest.fixture
def namespace(servers: tuple[str, str]) -> Iterator[str]:
    """A Redis key space of the test's own; its keys are deleted afterwards."""
    ns = f"lyt:{uuid.uuid4().hex[:12]}:"
    yield ns
    client = redis.Redis.from_url(servers[1])
    keys = list(client.scan_iter(match=f"{ns}*", count=1000))
    if keys:
        client.delete(*keys)
    client.close()


@pytest.fixture(scope="session")
def seal_keys() -> str:
    return new_key_entry("test1")


@pytest.fixture(scope="session")
def simulator(
    admin_engine: sa.Engine,
    servers: tuple[str, str],
    session_tag: str,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[str, sa.Engine]]:
    """The vendor simulator as a real process, recording into a database of its own."""
    name = f"lyt_sim_{session_tag}"
    _create_db(admin_engine, name)
    url = _with_db(servers[0], name)
    log = tmp_path_factory.mktemp("sim") / "simulator.log"
    proc = Proc(
        "simulator",
        python("-m", "simulators", "--port", "0", "--database-url", url),
        dict(os.environ),
        log,
    )
    found = proc.wait_for(r"simulators listening on (http://\S+)", timeout=30)
    engine = sa.create_engine(url, isolation_level="AUTOCOMMIT", hide_parameters=True)
    # Tools and models this test process calls itself (ad hoc calls, in-process attempts) find
    # the simulators as the workers do: through the environment, read at call time.
    os.environ["LIYAGENT_VENDOR_URL"] = found.group(1)
    os.environ[SIM_MODEL_KEY_ENV] = SIM_MODEL_KEY
    yield found.group(1), engine
    proc.kill()
    engine.dispose()
    _drop_db(admin_engine, name)


@pytest.fixture
def stack(
    db_url: str,
    namespace: str,
    servers: tuple[str, str],
    seal_keys: str,
    simulator: tuple[str, sa.Engine],
    tmp_path: Path,
) -> Iterator[Stack]:
    settings = Settings(
        database_url=db_url,
        redis_url=servers[1],
        namespace=namespace,
        vendor_url=simulator[0],
        model_profiles=sim_profiles(simulator[0]),
        tool_modules=TOOLS,
        timings=FAST,
    )
    s = Stack(
        settings=settings,
        sealer=parse_keys(seal_keys),
        seal_keys=seal_keys,
        tmp=tmp_path,
        sim_url=simulator[0],
        sim_engine=simulator[1],
    )
    yield s
    s.close()


# Figures a test publishes for the person running the suite (the kill trials' verdict): shown in
# the terminal summary, also when the test ran in an xdist worker, whose own output is hidden.
FIGURES_KEY = "liyagent_figures"


@pytest.fixture
def publish_figures(request: pytest.FixtureRequest) -> Iterator[list[str]]:
    """A list the test appends lines to; they are printed at the end of the test run."""
    lines: list[str] = []
    yield lines
    request.config.stash.setdefault(_FIGURES, []).extend(lines)


_FIGURES = pytest.StashKey[list[str]]()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The trials first: they are the suite's longest files, and `--dist loadfile` hands files
    out in collection order, so collected last (tests/trials/ sorts after integration/) they
    ran one after another at the end, minutes after the other workers were done."""
    items.sort(key=lambda item: not item.nodeid.startswith("tests/trials/"))


def pytest_sessionfinish(session: pytest.Session) -> None:
    """In an xdist worker: hand the figures to the controller."""
    workeroutput = getattr(session.config, "workeroutput", None)
    if workeroutput is not None:
        workeroutput[FIGURES_KEY] = session.config.stash.get(_FIGURES, [])


def pytest_testnodedown(node: object, error: object) -> None:
    """In the xdist controller: take a finished worker's figures."""
    config = getattr(node, "config", None)
    output = getattr(node, "workeroutput", {}) or {}
    if config is not None:
        config.stash.setdefault(_FIGURES, []).extend(output.get(FIGURES_KEY, []))


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    lines = terminalreporter.config.stash.get(_FIGURES, [])
    if lines:
        terminalreporter.section("liyagent figures")
        for line in lines:
            terminalreporter.write_line(line)
    report = os.environ.get("LIYAGENT_FIGURES_REPORT")
    if report:  # published evidence: the figures, the outcome and the commit they ran on
        stats = terminalreporter.stats
        outcome = {k: len(stats.get(k, [])) for k in ("passed", "failed", "error", "xfailed")}
        Path(report).parent.mkdir(parents=True, exist_ok=True)
        Path(report).write_text(
            json.dumps(
                {
                    "commit": measured_commit(),
                    "args": terminalreporter.config.invocation_params.args,
                    "outcome": outcome,
                    "figures": sorted(lines),
                },
                indent=2,
            )
            + "\n"
        )
        terminalreporter.write_line(f"figures written to {report}")
