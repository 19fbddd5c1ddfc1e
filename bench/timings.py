"""What a timed worker (`bench/timed_worker.py`) writes, and how the bench reads it: each
step's write as the worker waited for it, and the CPU of each of its threads by name."""

from __future__ import annotations

import json
import time
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from bench.lab import WorkerSpec

# The timed worker's Celery app (bench/timed_worker.py).
TIMED_APP = "bench.timed_worker"
# How often a timed worker writes its snapshot, and the name of the thread that writes it.
SNAPSHOT_EVERY_S = 0.5
OWN_THREAD = "bench-timings"
# Celery's thread pool runs each task (a run's attempt) on a thread of this name.
TASK_THREAD = "ThreadPoolExecutor-"
KINDS = ("task threads", "Celery main thread", "background threads")


def thread_kind(name: str) -> str:
    """The part of a worker a thread is: the task threads (the runs' steps), Celery's main
    thread (its consumer, timers and event loop), or a background thread."""
    if name.startswith(TASK_THREAD):
        return KINDS[0]
    if name == "MainThread":
        return KINDS[1]
    return KINDS[2]


def directory(base: Path) -> Path:
    """Where the timed workers of a lab under `base` write their snapshots (made if missing)."""
    (base / "timings").mkdir(exist_ok=True)
    return base / "timings"


def timed(spec: WorkerSpec, base: Path) -> WorkerSpec:
    """`spec` as a timed worker: liyagent's worker with the bench's two instruments."""
    env = {**spec.env, "BENCH_TIMINGS_DIR": str(directory(base))}
    return replace(spec, app=TIMED_APP, env=env)


def read(directory: Path, pid: int) -> dict[str, Any]:
    """A timed worker's latest snapshot; empty before its first."""
    try:
        return dict(json.loads((directory / f"{pid}.json").read_text()))
    except (OSError, ValueError):
        return {}


def fresh(directory: Path, pids: list[int]) -> list[dict[str, Any]]:
    """Each worker's snapshot, waited for until it was written after this call began."""
    began = time.time()
    deadline = began + 10 * SNAPSHOT_EVERY_S
    while True:
        snaps = [read(directory, pid) for pid in pids]
        if all(s.get("at", 0) > began for s in snaps) or time.time() > deadline:
            return snaps
        time.sleep(SNAPSHOT_EVERY_S / 5)


def thread_cpu(snaps: list[dict[str, Any]]) -> dict[str, float]:
    """CPU seconds by thread name, summed over the workers' snapshots."""
    used: dict[str, float] = {}
    for snap in snaps:
        for name, cpu in snap.get("thread_cpu_s", {}).items():
            used[name] = used.get(name, 0.0) + cpu
    return used


def split_ms(before: dict[str, float], after: dict[str, float], steps: int) -> dict[str, float]:
    """Worker CPU per step by part (KINDS), from two `thread_cpu` reads; the snapshot
    writer's own thread left out. A thread first seen at the second read started between them
    (Celery's pool starts its threads as the first tasks arrive): all its CPU is counted; a
    thread that ended between them is not (its CPU shows as the process's, unattributed)."""
    split = dict.fromkeys(KINDS, 0.0)
    for name, cpu in after.items():
        if name != OWN_THREAD:
            split[thread_kind(name)] += (cpu - before.get(name, 0.0)) * 1000 / steps
    return split


def own_s(before: dict[str, float], after: dict[str, float]) -> float:
    """CPU seconds the snapshot writer itself used between two reads (not the worker's)."""
    return after.get(OWN_THREAD, 0.0) - before.get(OWN_THREAD, 0.0)
