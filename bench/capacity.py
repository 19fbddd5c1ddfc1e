"""Capacity (issue 39): what one Postgres core carries, and where its ceiling is.

The lab's Postgres (production's durability) has one core to itself (`sched_setaffinity`: the
postmaster and every process it has on core 0, backends it forks later inherit it; the workers,
the simulators, Redis and the bench on the other cores) and serves liyagent alone: the model and
vendor simulators record into a Postgres of their own (`Lab.apart_simulator`). Timed workers
(`bench/timed_worker.py`: liyagent's worker, its step writes timed and its threads' CPU read)
under `-P threads -c THREADS` drain a burst of the 5-step agent at 0 ms model latency; the
offered load is raised by adding worker processes (one, two, three). Per level, counted by the
servers and the kernel:

- model steps/s and Postgres CPU (/proc: the postmaster's tree) over the burst, per step and in
  cores; WAL bytes (pg_current_wal_lsn) and WAL flushes per step and their mean time
  (pg_stat_wal's wal_sync and wal_sync_time, with track_wal_io_timing on for the section);
  transactions (pg_stat_database) and row writes (pg_stat_user_tables) per step, read after
  the workers stopped (their backends flush their statistics when they exit);
- a step's write (`INSERT INTO run_steps`) as the worker waits for it, p50 and p99;
- what the run database's backends were doing, sampled every 50 ms from pg_stat_activity: on
  CPU, or waiting (WAL flush, a lock, a client);
- the worker's CPU per step by part (task threads, Celery's main thread, background threads).

On a 2-core machine the workers and simulators run out of the other core long before Postgres
runs out of its own: the CPU ceiling is then one core over Postgres's CPU per step (the figure
says which), set beside the WAL flush ceiling (one flush at a time, each as long as the top
level's mean, shared by as many steps as shared one there), and the disk's own fdatasync/s
(`pg_test_fsync` in the lab's directory: one 8 kB write at a time, its best case).

Soak: the top level offered continuously for SOAK_S (120 s; autovacuum at its defaults); every
window, the runs table's live and dead tuples, its autovacuums, and the mean execution time of
the claim (`claim_delivery`), the step write and the sweeps' scans (pg_stat_statements).
"""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy.pool import NullPool

from bench import agents, procstat, timings
from bench.capacity_figures import (
    COLUMNS,
    STEPS_PER_RUN,
    Ceilings,
    Counters,
    Level,
    SoakSample,
    ceilings,
    figures,
    soak_rows,
)
from bench.lab import Lab
from bench.report import Section
from bench.settle import IDLE_FLUSH_S, gone, settled
from bench.sides import LiyagentSide, start_many, wait_ended
from liyagent.local import sim_model
from liyagent.local.procs import Proc
from liyagent.local.servers import pg_bin

WAIT_SAMPLE_S = 0.05
# Statement classes the soak follows, by a fragment of their text as pg_stat_statements keeps it
# (constants as $n): store/runs.py claim_delivery, store/checkpoints.py, the sweeps' scans.
CLASSES = {
    "claim": "deliveries = deliveries +",
    "step write": "INSERT INTO run_steps",
    "sweep": "FROM runs WHERE status",
}


@dataclass(frozen=True)
class CapacityOptions:
    levels: tuple[int, ...] = (1, 2, 3)  # worker processes
    threads: int = 8  # each worker's -c
    runs: int = 400  # per level
    soak_s: float = 120.0
    window_s: float = 10.0
    timeout_s: float = 240.0
    fsync_test_s: int = 2

    @classmethod
    def quick(cls) -> CapacityOptions:
        return cls(
            levels=(1, 2), runs=30, soak_s=12.0, window_s=4.0, timeout_s=90.0, fsync_test_s=1
        )


def _threads(pid: int) -> list[int]:
    """The thread ids of a process (empty once it is gone)."""
    try:
        return [int(t) for t in os.listdir(f"/proc/{pid}/task")]
    except OSError:
        return []


@dataclass
class _Placement:
    """CPU affinity set on every thread of some processes, and how to undo it."""

    every: set[int]
    saved: dict[int, set[int]] = field(default_factory=dict)  # thread id -> its mask before
    failed: int = 0

    def place(self, cores_of: dict[int, set[int]], trees: set[int]) -> None:
        """Each process's threads (and its descendants', for those in `trees`) on its cores."""
        for pid, cores in cores_of.items():
            for p in [pid, *(procstat.descendants(pid) if pid in trees else [])]:
                for tid in _threads(p):
                    try:
                        self.saved.setdefault(tid, os.sched_getaffinity(tid))
                        os.sched_setaffinity(tid, cores)
                    except OSError:
                        self.failed += 1

    def undo(self, pids: set[int], trees: set[int]) -> None:
        """Every thread of these processes back on its mask before, or on every core if it
        started inside (a backend forked meanwhile inherited its postmaster's one core)."""
        for pid in pids:
            for p in [pid, *(procstat.descendants(pid) if pid in trees else [])]:
                for tid in _threads(p):
                    with contextlib.suppress(OSError):
                        os.sched_setaffinity(tid, self.saved.get(tid, self.every))


@contextlib.contextmanager
def postgres_apart(lab: Lab, sim_pid: int) -> Iterator[tuple[int, _Placement]]:
    """While inside: Postgres alone on the first core (every thread of the postmaster and its
    processes; backends it forks later inherit it), and every thread of this process (so the
    workers it starts), the lab's Redis, the section's simulator and the Postgres its records go
    to on the others. Each thread's mask back after. The postmaster's pid, and the placement
    (how many threads could not be placed)."""
    assert lab.pg is not None, "the lab is not started"
    pg_pid = procstat.postmaster_pid(lab.pg.data)
    every = os.sched_getaffinity(0)
    first = min(every)
    others = (every - {first}) or every
    redis_pids = [int(r.pidfile.read_text()) for r in lab.redis_servers if r.pidfile.exists()]
    record_pids = [procstat.postmaster_pid(pg.data) for pg in lab.record_pgs]
    cores_of = {pg_pid: {first}, os.getpid(): others, sim_pid: others}
    cores_of.update({pid: others for pid in [*redis_pids, *record_pids]})
    trees = {pg_pid, sim_pid, *record_pids}
    placement = _Placement(every)
    placement.place(cores_of, trees)
    try:
        yield pg_pid, placement
    finally:
        placement.undo(set(cores_of), trees)


@contextlib.contextmanager
def wal_io_timed(lab: Lab) -> Iterator[None]:
    """track_wal_io_timing on while inside (every WAL flush's time in pg_stat_wal), off after."""

    def turn(sql: str) -> None:
        with lab.admin() as conn:
            conn.execute(sa.text(sql))
            conn.execute(sa.text("SELECT pg_reload_conf()"))

    turn("ALTER SYSTEM SET track_wal_io_timing = on")
    try:
        yield
    finally:
        turn("ALTER SYSTEM RESET track_wal_io_timing")


def fsyncs_per_s(directory: Path, seconds: int) -> float | None:
    """The disk's fdatasync ops/s for one 8 kB write (pg_test_fsync, `seconds` a test), or
    None when it cannot run."""
    try:
        out = subprocess.run(
            [pg_bin("pg_test_fsync"), "-s", str(seconds), "-f", str(directory / "fsync.test")],
            capture_output=True,
            text=True,
            timeout=120,
            check=True,
        ).stdout
    except (OSError, RuntimeError, subprocess.SubprocessError):
        return None
    found = re.search(r"fdatasync\s+([\d.,]+) ops/sec", out)
    return float(found.group(1).replace(",", "")) if found else None


class _Waits:
    """Samples what the run database's active backends are doing every WAIT_SAMPLE_S."""

    def __init__(self, lab: Lab, database: str) -> None:
        self.lab, self.database = lab, database
        self.seen: Counter[str] = Counter()
        self.peak_connections = 0
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def __enter__(self) -> _Waits:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._done.set()
        self._thread.join()

    def _loop(self) -> None:
        query = sa.text(
            "SELECT state, wait_event_type, wait_event FROM pg_stat_activity "
            "WHERE datname = :db AND backend_type = 'client backend'"
        )
        with self.lab.admin() as conn:
            while not self._done.wait(WAIT_SAMPLE_S):
                rows = conn.execute(query, {"db": self.database}).all()
                self.peak_connections = max(self.peak_connections, len(rows))
                for r in rows:
                    if r.state == "active":
                        self.seen[
                            f"{r.wait_event_type}:{r.wait_event}" if r.wait_event else "CPU"
                        ] += 1


@dataclass
class _Deployment:
    lab: Lab
    settings: Any
    database: str
    pg_pid: int
    sim_pid: int
    timings: Path

    def launch(self, prefix: str, n: int, threads: int) -> list[Proc]:
        """n timed threads workers, ready."""
        specs = [
            timings.timed(self.lab.liyagent(f"{prefix}-{i}", self.settings), self.lab.base)
            for i in range(n)
        ]
        return self.lab.launch(*specs, concurrency=threads, pool="threads")

    def counters(self, workers: list[Proc]) -> Counters:
        """Postgres's CPU and WAL position, and the workers' and simulator's CPU, now."""
        with self.lab.admin() as conn:
            lsn = str(conn.execute(sa.text("SELECT pg_current_wal_lsn()")).scalar())
        pids = [w.popen.pid for w in workers]
        snaps = timings.fresh(self.timings, pids)
        return Counters(
            pg_cpu_s=procstat.cpu_seconds(self.pg_pid),
            wal_lsn=lsn,
            worker_cpu_s=sum(procstat.cpu_seconds(w.popen.pid) for w in workers),
            sim_cpu_s=procstat.cpu_seconds(self.sim_pid),
            idle_s=procstat.MachineTimes.now().idle,
            threads=timings.thread_cpu(snaps),
            step_writes={
                pid: len(s.get("step_write_ms", [])) for pid, s in zip(pids, snaps, strict=True)
            },
        )

    def flushed(self, c: Counters) -> Counters:
        """`c` with the counters Postgres flushes late: transactions, row writes, WAL stats."""
        with self.lab.admin() as conn:
            c.xacts = int(
                conn.execute(
                    sa.text(
                        "SELECT xact_commit + xact_rollback FROM pg_stat_database "
                        "WHERE datname = :db"
                    ),
                    {"db": self.database},
                ).scalar_one()
            )
            wal = conn.execute(sa.text("SELECT * FROM pg_stat_wal")).mappings().one()
            c.wal = {k: float(v) for k, v in wal.items() if isinstance(v, (int, float, Decimal))}
        c.row_writes = int(
            _one(
                self.settings.database_url,
                "SELECT coalesce(sum(n_tup_ins + n_tup_upd + n_tup_del), 0) AS n "
                "FROM pg_stat_user_tables",
            ).n
        )
        return c


def _wal_bytes(lab: Lab, a: str, b: str) -> float:
    with lab.admin() as conn:
        return float(
            conn.execute(sa.text("SELECT pg_wal_lsn_diff(:b, :a)"), {"a": a, "b": b}).scalar_one()
        )


def _level(dep: _Deployment, n: int, opts: CapacityOptions) -> Level:
    """One offered load: n timed workers drain a burst of opts.runs runs."""
    steps = agents.five_step(0)
    workers = dep.launch(f"capacity-{n}", n, opts.threads)
    side = LiyagentSide(dep.settings, dep.lab.seal_keys)
    try:
        wait_ended(side, start_many(side, steps, 2 * n * opts.threads), opts.timeout_s)
        side.services.engine.dispose()  # its backends exit: their statistics are flushed
        settled(dep.lab, [dep.database], IDLE_FLUSH_S)
        before = dep.flushed(dep.counters(workers))
        window_began = time.monotonic()
        with _Waits(dep.lab, dep.database) as waits:
            started = time.time()
            ends = wait_ended(side, start_many(side, steps, opts.runs), opts.timeout_s)
        seconds = max(ends.values()) - started
        after = dep.counters(workers)
        window_s = time.monotonic() - window_began
        pids = [w.popen.pid for w in workers]
        # Each worker's writes timed within the burst: from its count at the window's start.
        writes = [
            ms
            for pid, snap in zip(pids, timings.fresh(dep.timings, pids), strict=True)
            for ms in snap.get("step_write_ms", [])[before.step_writes.get(pid, 0) :]
        ]
    finally:
        side.close()
        dep.lab.stop(*workers)
    gone(dep.lab, [dep.database])
    after = dep.flushed(after)
    return Level(
        workers=n,
        threads=opts.threads,
        runs=opts.runs,
        seconds=seconds,
        window_s=window_s,
        pg_cpu_s=after.pg_cpu_s - before.pg_cpu_s,
        wal_bytes=_wal_bytes(dep.lab, before.wal_lsn, after.wal_lsn),
        wal={k: v - before.wal.get(k, 0.0) for k, v in after.wal.items()},
        xacts=after.xacts - before.xacts,
        row_writes=after.row_writes - before.row_writes,
        worker_cpu_s=after.worker_cpu_s
        - before.worker_cpu_s
        - timings.own_s(before.threads, after.threads),
        worker_split_ms=timings.split_ms(before.threads, after.threads, opts.runs * STEPS_PER_RUN),
        sim_cpu_s=after.sim_cpu_s - before.sim_cpu_s,
        idle_s=after.idle_s - before.idle_s,
        step_write_ms=writes,
        waits=dict(waits.seen),
        peak_connections=waits.peak_connections,
    )


def _statement_times(dep: _Deployment) -> dict[str, tuple[int, float]]:
    """Calls and total execution ms of each statement class so far (pg_stat_statements)."""
    out: dict[str, tuple[int, float]] = {}
    with dep.lab.admin() as conn:
        rows = conn.execute(
            sa.text(
                "SELECT s.query, s.calls, s.total_exec_time FROM pg_stat_statements s "
                "JOIN pg_database d ON d.oid = s.dbid WHERE d.datname = :db"
            ),
            {"db": dep.database},
        ).all()
    for r in rows:
        for name, fragment in CLASSES.items():
            if fragment in r.query:
                calls, total = out.get(name, (0, 0.0))
                out[name] = (calls + int(r.calls), total + float(r.total_exec_time))
    return out


def _means(
    before: dict[str, tuple[int, float]], after: dict[str, tuple[int, float]]
) -> dict[str, float]:
    """Mean execution ms of each statement class between two reads."""
    out = {}
    for name, (calls, total) in after.items():
        calls0, total0 = before.get(name, (0, 0.0))
        if calls > calls0:
            out[name] = (total - total0) / (calls - calls0)
    return out


def _one(database_url: str, query: str) -> Any:
    """One row of `query` on the run database, on a connection of its own (closed after, so
    its statistics never linger in a window)."""
    engine = sa.create_engine(
        database_url, isolation_level="AUTOCOMMIT", poolclass=NullPool, hide_parameters=True
    )
    try:
        with engine.connect() as conn:
            return conn.execute(sa.text(query)).one()
    finally:
        engine.dispose()


def _tuples(dep: _Deployment) -> tuple[int, int, int]:
    """The runs table's live and dead tuples and its autovacuums so far."""
    r = _one(
        dep.settings.database_url,
        "SELECT n_live_tup, n_dead_tup, autovacuum_count FROM pg_stat_user_tables "
        "WHERE relname = 'runs'",
    )
    return int(r.n_live_tup), int(r.n_dead_tup), int(r.autovacuum_count)


def _soak(dep: _Deployment, n: int, opts: CapacityOptions) -> list[SoakSample]:
    """The top level offered without a pause for opts.soak_s: a starter keeps 2 runs per
    worker thread queued or running; a sample per window."""
    steps = agents.five_step(0)
    workers = dep.launch("soak", n, opts.threads)
    side = LiyagentSide(dep.settings, dep.lab.seal_keys)
    in_flight = 2 * n * opts.threads
    samples: list[SoakSample] = []
    ended_total = 0
    try:
        ids = start_many(side, steps, in_flight)
        began = time.monotonic()
        last_t, last_ended, last_stmts = began, 0, _statement_times(dep)
        vacuums_before = _tuples(dep)[2]  # the levels' autovacuums are not the soak's
        while time.monotonic() - began < opts.soak_s:
            time.sleep(0.25)
            done = side.ended(ids)
            if done:
                ended_total += len(done)
                ids = [i for i in ids if i not in done] + start_many(side, steps, len(done))
            if time.monotonic() - last_t >= opts.window_s:
                now, stmts = time.monotonic(), _statement_times(dep)
                live, dead, vacuums = _tuples(dep)
                means = _means(last_stmts, stmts)
                samples.append(
                    SoakSample(
                        at_s=round(now - began, 1),
                        steps_per_s=(ended_total - last_ended) * STEPS_PER_RUN / (now - last_t),
                        live=live,
                        dead=dead,
                        autovacuums=vacuums - vacuums_before,
                        mean_ms=means,
                    )
                )
                last_t, last_ended, last_stmts = now, ended_total, stmts
        wait_ended(side, ids, opts.timeout_s)
    finally:
        side.close()
        dep.lab.stop(*workers)
    return samples


def measure_capacity(lab: Lab, opts: CapacityOptions) -> Section:
    """The capacity section (see the module docstring)."""
    section = Section(
        "capacity",
        f"Capacity: one Postgres core, 1-{opts.levels[-1]} timed workers (-P threads "
        f"-c {opts.threads}), 5-step agent at 0 ms",
    )
    sim_url, sim_pid = lab.apart_simulator()
    database_url = lab.database("bench_capacity")
    settings = lab.settings(
        database_url, vendor_url=sim_url, model_profiles=sim_model.profiles(sim_url)
    )
    timings_dir = timings.directory(lab.base)
    fsync = fsyncs_per_s(lab.base, opts.fsync_test_s)
    with postgres_apart(lab, sim_pid) as (pg_pid, placement), wal_io_timed(lab):
        database = str(sa.make_url(database_url).database)
        dep = _Deployment(lab, settings, database, pg_pid, sim_pid, timings_dir)
        levels = [_level(dep, n, opts) for n in opts.levels]
        soak = _soak(dep, opts.levels[-1], opts)
    c: Ceilings = ceilings(levels[-1], fsync)
    section.figures = figures(levels, c, soak)
    section.matrix = (COLUMNS, [lv.row() for lv in levels])
    section.detail = {
        "levels": [{**lv.__dict__, "step_write_ms": None} for lv in levels],
        "step_write_ms": {lv.workers: lv.step_write_ms for lv in levels},
        "ceilings": c.__dict__,
        "soak": soak_rows(soak),
        "statement_classes": CLASSES,
        "threads_not_placed": placement.failed,
        "options": opts.__dict__,
    }
    return section
