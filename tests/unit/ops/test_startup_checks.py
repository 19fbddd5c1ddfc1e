"""What a worker checks at start and how it paces itself while Postgres is out of reach: the
pools it runs under, the runs' queue it must consume, the back-off between tries."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from runtime.base.pools import WorkerPool
from runtime.base.settings import ConfigError, Settings, database_pooler
from runtime.ops.startup import (
    StartupRefused,
    bounds_problem,
    check_connections,
    check_pool,
    queue_warning,
)
from runtime.recovery import outage
from store import db
from store.db import Pooler
from tasks.worker import pool_name


@pytest.mark.parametrize("name", ["prefork", "processes", "threads", "solo"])
def test_the_supported_pools_pass(name: str) -> None:
    check_pool(name)


@pytest.mark.parametrize("name", ["gevent", "eventlet", "custom", "my.pool:Pool"])
def test_any_other_pool_is_refused_naming_the_supported_ones(name: str) -> None:
    with pytest.raises(StartupRefused) as refused:
        check_pool(name)
    assert refused.value.code == 2
    assert f"the {name} pool is not supported" in str(refused.value)
    assert "-P prefork (the default), -P threads or -P solo" in str(refused.value)


def test_the_pool_is_named_as_celery_names_it_from_a_class_or_from_configuration() -> None:
    from celery.concurrency.prefork import TaskPool as Prefork
    from celery.concurrency.thread import TaskPool as Threads

    assert pool_name(SimpleNamespace(pool_cls=Prefork)) == "prefork"
    assert pool_name(SimpleNamespace(pool_cls=Threads)) == "threads"
    assert pool_name(SimpleNamespace(pool_cls="gevent")) == "gevent"
    assert pool_name(SimpleNamespace(pool_cls="celery.concurrency.solo:TaskPool")) == "solo"


def test_a_worker_leaving_out_the_runs_queue_is_told_both_names() -> None:
    assert queue_warning(["liyagent", "liyagent.ops"], "liyagent") is None
    assert queue_warning(["liyagent.ops"], "liyagent") is None  # a periodic-work-only worker
    said = queue_warning(["other"], "liyagent")
    assert said is not None and "consumes other but not liyagent" in said
    assert "LIYAGENT_QUEUE=liyagent" in said


def test_tries_back_off_to_a_ceiling_and_start_over_once_the_database_answers() -> None:
    now = [100.0]
    state = outage.Outage(clock=lambda: now[0])
    pauses = [state.failed() for _ in range(7)]
    assert pauses == [0.5, 1.0, 2.0, 2.0, 2.0, 2.0, 2.0]
    now[0] += 12.5
    assert state.answered() == 12.5
    assert state.answered() is None
    assert state.failed() == outage.FIRST_PAUSE_S


def test_the_database_problem_names_the_server_without_its_password() -> None:
    url = "postgresql+psycopg://postgres:pw-s3cret@db.example:5433/liyagent"
    said = outage.database_problem(ConnectionRefusedError("Connection refused"), url)
    assert "pw-s3cret" not in said
    assert said == (
        "cannot use Postgres at postgresql+psycopg://postgres:***@db.example:5433/liyagent "
        "(Connection refused); start it, or point LIYAGENT_DATABASE_URL at a running server"
    )


def test_the_pooler_setting_reads_pgbouncer_or_none_and_names_itself_otherwise() -> None:
    assert database_pooler("") is Pooler.NONE
    assert database_pooler(" none ") is Pooler.NONE
    assert database_pooler("PgBouncer") is Pooler.PGBOUNCER
    with pytest.raises(ConfigError) as refused:
        database_pooler("pgpool")
    assert str(refused.value).startswith("LIYAGENT_DATABASE_POOLER='pgpool': use pgbouncer")


def test_a_pooled_role_without_every_bound_or_with_a_looser_one_is_refused() -> None:
    bounded = dict(db.SESSION_BOUNDS_MS)
    assert bounds_problem(Pooler.PGBOUNCER, "app", "liyagent", bounded) is None
    tighter = {name: ms // 2 for name, ms in bounded.items()}
    assert bounds_problem(Pooler.PGBOUNCER, "app", "liyagent", tighter) is None
    said = bounds_problem(
        Pooler.PGBOUNCER,
        "App Role",
        "liyagent",
        {**bounded, "lock_timeout": 0, "statement_timeout": 60_000},
    )
    assert said is not None and said.startswith("LIYAGENT_DATABASE_POOLER=pgbouncer: ")
    assert "lock_timeout=none, statement_timeout=60000" in said
    assert 'ALTER ROLE "App Role" IN DATABASE liyagent SET lock_timeout = 5000' in said
    assert "SET statement_timeout = 30000" in said
    assert "SET idle_in_transaction_session_timeout" not in said  # that one is set
    assert "RECONNECT" in said


def test_a_pooled_worker_is_not_held_to_the_servers_max_connections() -> None:
    pooled = Settings(database_pooler=Pooler.PGBOUNCER)
    assert check_connections(pooled, WorkerPool("threads", 5000)) is None
