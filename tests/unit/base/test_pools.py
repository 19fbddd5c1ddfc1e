"""A process's connection pools follow its worker's pool, and a worker whose threads the pools
or Postgres cannot serve is refused with the numbers (pure: no server involved)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from runtime import services as runtime_services
from runtime.base import pools
from runtime.base.sealing import new_key_entry, parse_keys
from runtime.base.settings import Settings
from runtime.ops.startup import connection_refusal
from store.db import ConnectionLimits
from tests.support.stack import RecordingPublisher

SERVER = ConnectionLimits(max_connections=100, reserved=3, in_use=10)


@pytest.fixture
def threads_worker() -> Iterator[None]:
    pools.note_worker(pools.WorkerPool("threads", 200))
    yield
    pools.note_worker(None)


def _built(settings: Settings) -> runtime_services.Services:
    # Never connects: an engine and a Redis client open connections on first use only.
    return runtime_services.build(
        settings, RecordingPublisher(), sealer=parse_keys(new_key_entry("k1"))
    )


@pytest.mark.parametrize(("configured", "db_max"), [(0, 32), (60, 60), (300, 300)])
def test_a_thread_pool_worker_sizes_its_pools_from_its_concurrency(
    threads_worker: None, configured: int, db_max: int
) -> None:
    url = f"postgresql+psycopg://postgres@127.0.0.1:5432/lyt_pools_{configured}"
    s = _built(Settings(database_url=url, db_pool_max=configured))
    pool = s.engine.pool
    assert pool.size() + pool._max_overflow == db_max  # type: ignore[attr-defined]
    assert s.redis.connection_pool.max_connections == 204
    assert s.engine.url.database == f"lyt_pools_{configured}"


def test_other_processes_keep_the_default_bounds() -> None:
    s = _built(Settings(database_url="postgresql+psycopg://postgres@127.0.0.1:5432/lyt_pools_d"))
    assert s.engine.pool.size() + s.engine.pool._max_overflow == 15  # type: ignore[attr-defined]
    assert s.redis.connection_pool.max_connections == 15


def test_a_prefork_worker_is_counted_one_connection_a_child() -> None:
    assert connection_refusal(Settings(), pools.WorkerPool("prefork", 93), SERVER) is None
    refused = connection_refusal(Settings(), pools.WorkerPool("prefork", 94), SERVER)
    assert refused is not None and "lower -c to 93 or less" in refused


def test_a_thread_pool_worker_fits_a_stock_postgres_unless_told_otherwise() -> None:
    # 500 threads on a stock server (max_connections 100): the default bound (32) is served,
    # the threads take turns on it; an explicit bound over what the server takes is refused.
    threads = pools.WorkerPool("threads", 500)
    assert pools.at_once(threads, 0) == pools.THREADS_DB_POOL_DEFAULT
    assert connection_refusal(Settings(), threads, SERVER) is None
    assert connection_refusal(Settings(db_pool_max=97), threads, SERVER) is None
    refused = connection_refusal(Settings(db_pool_max=98), threads, SERVER)
    assert refused is not None
    assert "-P threads -c 500 with LIYAGENT_DB_POOL_MAX=98 can open 98 Postgres" in refused
    assert "max_connections=100, 3 of them reserved" in refused
    assert "set LIYAGENT_DB_POOL_MAX to at most 97" in refused


def test_a_few_threads_are_bounded_by_their_count_and_a_small_server_refuses_the_default() -> None:
    assert pools.at_once(pools.WorkerPool("threads", 10), 0) == 14
    small = ConnectionLimits(max_connections=30, reserved=3, in_use=0)
    refused = connection_refusal(Settings(), pools.WorkerPool("threads", 200), small)
    assert refused is not None
    assert "-P threads -c 200 (LIYAGENT_DB_POOL_MAX unset" in refused
    assert "can open 32 Postgres connections" in refused
    assert "set LIYAGENT_DB_POOL_MAX to at most 27" in refused
