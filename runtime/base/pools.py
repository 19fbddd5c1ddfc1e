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


def needed() -> int:
    """Connections this process's own pools must be able to open for its threads."""
    if _worker is None or _worker.name not in IN_PROCESS:
        return DEFAULT_POOL_MAX
    return max(DEFAULT_POOL_MAX, _worker.threads + MAIN_THREADS)


def pool_max(configured: int) -> int:
    """The bound of one of this process's pools: the setting when given, else what it needs."""
    return configured or needed()


def at_once(pool: WorkerPool, configured: int) -> int:
    """Postgres connections the whole worker (every process of it) can have open at once: a
    prefork worker one per child and its main process's threads; a thread pool its one
    process's pool bound (the setting, or its threads and the main process's)."""
    if pool.name in IN_PROCESS:
        return configured or max(pool.threads + MAIN_THREADS, 1)
    return pool.concurrency + MAIN_THREADS
