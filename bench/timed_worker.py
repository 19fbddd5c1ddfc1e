"""liyagent's worker with two instruments the bench reads, and nothing else changed:

    celery -A bench.timed_worker worker -P threads ...

- each step's write (the `INSERT INTO run_steps` statement, `store/checkpoints.py`), timed
  around the driver's execute as the run's thread waits for it: the round trip, the server's
  work and its commit's WAL flush (autocommit), and the waits of the worker's own process (the
  interpreter lock, a free CPU); not the wait for a pooled connection;
- the CPU each thread of the process used, by its Python name, read from
  /proc/self/task/<tid>/schedstat (nanoseconds), so the bench can say which part of a step's
  CPU is the task threads' (the engine's in-task work and its HTTP) and which the background
  threads'.

Both are written, as JSON, to `$BENCH_TIMINGS_DIR/<pid>.json` twice a second (replaced whole,
so a reader never sees half of one) by a thread of its own, which the bench leaves out of the
worker's CPU: it reads the file at the start and the end of a window and takes the difference.
"""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from celery.signals import worker_ready

from bench.timings import OWN_THREAD, SNAPSHOT_EVERY_S
from liyagent.worker import app

STEP_WRITE = "INSERT INTO run_steps"
_writes_ms: list[float] = []
_lock = threading.Lock()


def _before(conn: Any, cursor: Any, statement: str, *_: Any) -> None:
    if STEP_WRITE in statement:
        conn.info["bench_t0"] = time.perf_counter()


def _after(conn: Any, cursor: Any, statement: str, *_: Any) -> None:
    began = conn.info.pop("bench_t0", None)
    if began is not None:
        with _lock:
            _writes_ms.append((time.perf_counter() - began) * 1000)


sa.event.listen(sa.engine.Engine, "before_cursor_execute", _before)
sa.event.listen(sa.engine.Engine, "after_cursor_execute", _after)


def thread_cpu_s() -> dict[str, float]:
    """CPU seconds of each live thread of this process, by its Python name: the first field
    of /proc/self/task/<tid>/schedstat, in nanoseconds (stat's utime and stime are whole clock
    ticks, 10 ms: a thread that ran 5 ms read as 0, so 500 threads lost about a tick each)."""
    used: dict[str, float] = {}
    for thread in threading.enumerate():
        try:
            raw = Path(f"/proc/self/task/{thread.native_id}/schedstat").read_text()
        except OSError:
            continue
        used[thread.name] = used.get(thread.name, 0.0) + int(raw.split()[0]) / 1e9
    return used


def _write_every(out: Path) -> None:
    target, part = out / f"{os.getpid()}.json", out / f"{os.getpid()}.part"
    while True:
        with _lock:
            writes = list(_writes_ms)
        snapshot = {"at": time.time(), "step_write_ms": writes, "thread_cpu_s": thread_cpu_s()}
        part.write_text(json.dumps(snapshot))
        part.replace(target)
        time.sleep(SNAPSHOT_EVERY_S)


@worker_ready.connect  # type: ignore[untyped-decorator]  # Celery's signals are untyped
def _start_writer(**_: Any) -> None:
    out = os.environ.get("BENCH_TIMINGS_DIR")
    if out:
        threading.Thread(
            target=_write_every, args=(Path(out),), name=OWN_THREAD, daemon=True
        ).start()


__all__ = ["app"]
