"""The capacity section's results (`capacity.py` measures them): what each offered load cost
one Postgres core, where its ceiling is, and how claims and sweeps aged under a soak."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from bench.report import Figure, quantile

STEPS_PER_RUN = 5  # the bench's agent (bench/agents.py five_step)


@dataclass
class Counters:
    """What Postgres and the machine counted, read at one moment."""

    pg_cpu_s: float = 0.0
    wal_lsn: str = "0/0"
    wal: dict[str, float] = field(default_factory=dict)  # pg_stat_wal
    xacts: int = 0
    row_writes: int = 0
    worker_cpu_s: float = 0.0
    sim_cpu_s: float = 0.0
    idle_s: float = 0.0
    threads: dict[str, float] = field(default_factory=dict)  # thread name -> CPU s
    # Each timed worker's step writes so far (its pid -> how many it timed).
    step_writes: dict[int, int] = field(default_factory=dict)


@dataclass
class Level:
    """One offered load: `workers` timed threads workers draining a burst of runs."""

    workers: int
    threads: int
    runs: int
    seconds: float  # the burst: its first start to its last run's end
    window_s: float  # the counters' window around it (CPU and idle time are read over it)
    pg_cpu_s: float
    wal_bytes: float
    wal: dict[str, float]
    xacts: int
    row_writes: int
    worker_cpu_s: float
    worker_split_ms: dict[str, float]
    sim_cpu_s: float
    idle_s: float
    step_write_ms: list[float]
    waits: dict[str, int]
    peak_connections: int

    @property
    def steps(self) -> int:
        return self.runs * STEPS_PER_RUN

    @property
    def steps_per_s(self) -> float:
        return self.steps / self.seconds

    @property
    def pg_cores(self) -> float:
        return self.pg_cpu_s / self.window_s

    @property
    def pg_ms_per_step(self) -> float:
        return self.pg_cpu_s * 1000 / self.steps

    def per_step(self, value: float) -> float:
        return value / self.steps

    def waits_share(self) -> dict[str, float]:
        """What the run database's active backends were doing when sampled, by WAIT_KINDS,
        as shares of the samples."""
        total = sum(self.waits.values())
        shares = dict.fromkeys(WAIT_KINDS, 0.0)
        for seen, n in self.waits.items():
            shares[wait_kind(seen)] += n / total if total else 0.0
        return shares

    def row(self) -> list[str]:
        p99 = quantile(self.step_write_ms, 0.99)
        waits = self.waits_share()
        return [
            f"{self.workers} x -c {self.threads}",
            f"{self.steps_per_s:.0f}",
            f"{self.pg_cores:.2f}",
            f"{self.pg_ms_per_step:.2f}",
            f"{self.per_step(self.wal_bytes):.0f}",
            f"{self.per_step(self.wal.get('wal_sync', 0)):.2f}",
            f"{self.per_step(self.xacts):.2f}",
            f"{self.per_step(self.row_writes):.2f}",
            "-" if p99 is None else f"{p99:.1f}",
            f"{self.worker_cpu_s * 1000 / self.steps:.2f}",
            f"{self.idle_s / self.window_s:.2f}",
            "/".join(f"{100 * waits[k]:.0f}" for k in WAIT_KINDS[:3]),
        ]


# What a sampled backend was doing: on CPU, waiting for the WAL to be flushed (its own fsync or
# another's: WALSync, WALWrite), for a row or transaction lock, or for anything else.
WAIT_KINDS = ("CPU", "WAL", "lock", "other")


def wait_kind(seen: str) -> str:
    if seen == "CPU":
        return "CPU"
    if "WAL" in seen:
        return "WAL"
    if seen.startswith("Lock:"):
        return "lock"
    return "other"


COLUMNS = [
    "workers",
    "steps/s",
    "PG cores",
    "PG ms/step",
    "WAL B/step",
    "fsyncs/step",
    "xacts/step",
    "rows/step",
    "write p99 ms",
    "worker ms/step",
    "idle cores",
    "% " + "/".join(WAIT_KINDS[:3]),
]


@dataclass
class SoakSample:
    """One window of the soak: the runs table's tuples and what its statements cost."""

    at_s: float
    steps_per_s: float
    live: int
    dead: int
    autovacuums: int
    mean_ms: dict[str, float]  # statement class -> mean execution time in the window


@dataclass
class Ceilings:
    """What one Postgres core carries, by each resource, from the top level's figures."""

    cpu_steps_per_s: float
    flush_ms: float | None  # a WAL flush's mean under that load (pg_stat_wal)
    flush_steps_per_s: float | None
    disk_fsyncs_per_s: float | None  # the disk alone, one 8 kB write at a time (pg_test_fsync)


def ceilings(top: Level, disk_fsyncs_per_s: float | None) -> Ceilings:
    """The CPU ceiling (one core over Postgres's CPU per step) and the WAL flush ceiling: one
    flush at a time, each as long as the top level's mean, shared by as many steps as shared
    one there (group commit shares more as the load grows, so this is a floor of it)."""
    syncs, sync_ms = top.wal.get("wal_sync", 0.0), top.wal.get("wal_sync_time", 0.0)
    flush_ms = sync_ms / syncs if syncs and sync_ms else None
    per_step = top.per_step(syncs)
    flush_steps = 1000 / (flush_ms * per_step) if flush_ms and per_step > 0 else None
    return Ceilings(
        cpu_steps_per_s=1000 / top.pg_ms_per_step,
        flush_ms=flush_ms,
        flush_steps_per_s=flush_steps,
        disk_fsyncs_per_s=disk_fsyncs_per_s,
    )


def carried(c: Ceilings) -> float:
    """What one core carries: the lower of its CPU and WAL flush ceilings."""
    return min(c.cpu_steps_per_s, c.flush_steps_per_s or c.cpu_steps_per_s)


def first_limit(c: Ceilings) -> str:
    """Which of one core's resources runs out first, by the two ceilings."""
    if c.flush_steps_per_s is not None and c.flush_steps_per_s < c.cpu_steps_per_s:
        return "the WAL flush, before Postgres's CPU"
    return "Postgres's CPU, before the WAL flush"


def figures(levels: list[Level], c: Ceilings, soak: list[SoakSample]) -> list[Figure]:
    top = levels[-1]
    waits = top.waits_share()
    out = [
        Figure("top_steps_per_s", "model steps/s at the highest load", top.steps_per_s, "/s"),
        Figure("top_pg_cores", "Postgres busy at the highest load", top.pg_cores, "cores"),
        Figure("pg_cpu_ms_per_step", "Postgres CPU per model step", top.pg_ms_per_step, "ms"),
        Figure(
            "cpu_steps_per_s",
            "model steps/s one Postgres core's CPU carries (one core / its CPU per step)",
            c.cpu_steps_per_s,
            "/s",
            digits=0,
        ),
        Figure(
            "steps_per_pg_core",
            "model steps/s one Postgres core carries (the lower of its CPU and WAL flush)",
            carried(c),
            "/s",
            digits=0,
            note=f"first limit: {first_limit(c)}",
        ),
        Figure(
            "runs_per_pg_core",
            "5-step runs/s one Postgres core carries",
            carried(c) / STEPS_PER_RUN,
            "/s",
            digits=0,
        ),
        Figure(
            "flush_ms",
            "a WAL flush under that load, mean (pg_stat_wal)",
            c.flush_ms,
            "ms",
            note="" if c.flush_ms is not None else "no WAL flush was timed",
        ),
        Figure(
            "fsyncs_per_step",
            "WAL flushes per model step (group commit shares them)",
            top.per_step(top.wal.get("wal_sync", 0.0)),
            "",
        ),
        Figure(
            "flush_steps_per_s",
            "model steps/s the WAL flush carries at that flush time and sharing",
            c.flush_steps_per_s,
            "/s",
            digits=0,
            note="" if c.flush_steps_per_s is not None else "no WAL flush was timed",
        ),
        Figure(
            "disk_fsyncs_per_s",
            "the disk alone: fdatasync/s of one 8 kB write (pg_test_fsync)",
            c.disk_fsyncs_per_s,
            "/s",
            note="" if c.disk_fsyncs_per_s is not None else "pg_test_fsync did not run",
        ),
        Figure("wal_bytes_per_step", "WAL bytes per model step", top.per_step(top.wal_bytes), "B"),
        Figure("xacts_per_step", "transactions per model step", top.per_step(top.xacts), ""),
        Figure("rows_per_step", "row writes per model step", top.per_step(top.row_writes), ""),
        Figure(
            "step_write_p50_ms",
            "a step's write as the worker waits for it, p50",
            quantile(top.step_write_ms, 0.5),
            "ms",
        ),
        Figure(
            "step_write_p99_ms",
            "a step's write as the worker waits for it, p99",
            quantile(top.step_write_ms, 0.99),
            "ms",
        ),
        Figure("waits_cpu", "backends sampled on CPU", 100 * waits["CPU"], "%", digits=0),
        Figure(
            "waits_wal",
            "backends sampled waiting on the WAL flush",
            100 * waits["WAL"],
            "%",
            digits=0,
        ),
        Figure(
            "waits_lock", "backends sampled waiting on a lock", 100 * waits["lock"], "%", digits=0
        ),
        Figure("pg_connections", "peak connections to the run database", top.peak_connections, ""),
    ]
    if len(soak) >= 2:
        first, last = soak[0], soak[-1]
        out += [
            Figure(
                "soak_dead_peak",
                "soak: dead tuples of runs, peak",
                max(s.dead for s in soak),
                "",
                digits=0,
            ),
            Figure("soak_autovacuums", "soak: autovacuums of runs", last.autovacuums, "", digits=0),
        ]
        for name in ("claim", "sweep"):
            for at, sample in (("first", first), ("last", last)):
                out.append(
                    Figure(
                        f"soak_{name}_{at}_ms",
                        f"soak: a {name} statement's mean, {at} window",
                        sample.mean_ms.get(name),
                        "ms",
                        digits=3,
                    )
                )
    return out


def soak_rows(soak: list[SoakSample]) -> list[dict[str, Any]]:
    return [s.__dict__ for s in soak]
