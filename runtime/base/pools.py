"""How many connections one process may open to Postgres and to Redis, from its worker's pool.

Every statement checks a database connection out for itself alone and gives it back (no
connection is held across a model or tool call), and every Redis command or pipeline does the
same, so a process needs at most one connection per thread that can be inside a statement at
once: a `-P threads -c N` worker runs N task threads in one process, a prefork child one.
Beside its task threads a worker's main process uses both stores from a few threads of its own
(`MAIN_THREADS`). The worker glue (tasks/) notes its pool here before any engine is built.
"""

from __future__ import annotations

from dataclasses import dataclass

from store.db import DEFAULT_POOL_MAX

# Threads of a worker's main process that use the pools beside the task threads: the lease
# heartbeat, the death watch, Celery's consumer (reservations, a dead pool child's claim), and
# one to spare.
MAIN_THREADS = 4
# Pools whose task threads all run in the worker's main process.
IN_PROCESS = frozenset({"threads", "solo"})
# The bound of a thread pool worker's Postgres pool when LIYAGENT_DB_POOL_MAX does not set one.
# Its threads take turns on it (each holds a connection for one statement, never across a model
# or tool call), and what one process has inside a statement at once is bounded by its one
# interpreter lock, not by -c: `make bench`'s density section measured a peak of 24 at -c 500
# (df3efab). So the default fits a stock Postgres (max_connections 100, 97 for clients) with
# beat, the front and a CLI beside it, and docs/workers.md's `-P threads -c 200` starts as written
# (following -c, it asked for 204 connections and was refused; issue 31).
THREADS_DB_POOL_DEFAULT = 32


@dataclass(frozen=True)
class WorkerPool:
    """A worker's Celery pool (its alias: prefork, threads, solo...) and its concurrency."""

    name: str
    concurrency: int

    @property
    def threads(self) -> int:
        """Task threads that run in this worker's main process (prefork: none; solo: one)."""
        if self.name == "threads":
            return self.concurrency
        return 1 if self.name == "solo" else 0

    def describe(self) -> str:
        return f"-P {self.name} -c {self.concurrency}"


_worker: WorkerPool | None = None


def note_worker(pool: WorkerPool | None) -> None:
    """Called by a worker's main process before it builds its services (so before it forks)."""
    global _worker
    _worker = pool


def worker() -> WorkerPool | None:
    return _worker


def redis_needed() -> int:
    """Redis connections this process's pool must be able to open: one per thread that can be
    inside a command at once (a used-up Redis pool fails the command rather than waiting)."""
    if _worker is None or _worker.name not in IN_PROCESS:
        return DEFAULT_POOL_MAX
    return max(DEFAULT_POOL_MAX, _worker.threads + MAIN_THREADS)


def redis_pool_max(configured: int) -> int:
    """The bound of this process's Redis pool: LIYAGENT_REDIS_POOL_MAX when given, else what
    its threads need."""
    return configured or redis_needed()


def db_pool_max(configured: int) -> int:
    """The bound of this process's Postgres pool: LIYAGENT_DB_POOL_MAX when given, else one per
    thread up to THREADS_DB_POOL_DEFAULT (threads beyond it take turns), and never under the
    default of any other process."""
    if configured:
        return configured
    if _worker is None or _worker.name not in IN_PROCESS:
        return DEFAULT_POOL_MAX
    return max(DEFAULT_POOL_MAX, _in_process_default(_worker))


def _in_process_default(pool: WorkerPool) -> int:
    return min(max(pool.threads + MAIN_THREADS, 1), THREADS_DB_POOL_DEFAULT)


def at_once(pool: WorkerPool, configured: int) -> int:
    """Postgres connections the whole worker (every process of it) can have open at once: a
    prefork worker one per child and its main process's threads; a thread pool its one
    process's pool bound (the setting, or its threads and the main process's up to
    THREADS_DB_POOL_DEFAULT)."""
    if pool.name in IN_PROCESS:
        return configured or _in_process_default(pool)
    return pool.concurrency + MAIN_THREADS
