"""A worker's Celery pool, as the engine needs to know it: which pool and how many task slots,
so its connection pools are sized for its threads and a worker Postgres cannot serve refuses
to start."""

from __future__ import annotations

import os
import sys
from typing import Any

import structlog
from celery import concurrency

from runtime.base import pools
from runtime.base.settings import get_settings
from runtime.ops import startup

log = structlog.get_logger(__name__)


def worker_pool(worker: Any) -> pools.WorkerPool:
    """The pool alias (prefork, threads, solo, ...) and concurrency of Celery's WorkController
    at `worker_init` (its pool may still be a name or already a class; `auto` not resolved)."""
    cls = worker.pool_cls
    path = cls if isinstance(cls, str) else f"{cls.__module__}:{cls.__qualname__}"
    name = next((a for a, p in concurrency.ALIASES.items() if path in (a, p)), path)
    name = "prefork" if name == "processes" else name
    n = worker.concurrency
    count = int(n) if str(n).isdigit() else os.cpu_count() or 1
    return pools.WorkerPool(name, count)


def size_and_check(worker: Any) -> None:
    """Size this process's pools for the worker's threads (before anything opens them or the
    pool forks), then refuse to start, with the numbers and what to set, if they or Postgres
    cannot serve them."""
    pool = worker_pool(worker)
    pools.note_worker(pool)
    try:
        warning = startup.check_connections(get_settings(), pool)
    except startup.StartupRefused as exc:
        print(f"liyagent worker does not start: {exc}", file=sys.stderr, flush=True)
        raise SystemExit(2) from None
    if warning is not None:
        log.warning("worker.connections_warning", why=warning)
    log.info(
        "worker.pools",
        pool=pool.name,
        concurrency=pool.concurrency,
        db_pool_max=pools.db_pool_max(get_settings().db_pool_max),
        redis_pool_max=pools.redis_pool_max(get_settings().redis_pool_max),
    )
