"""Section 6's results and figures: what a burst, a mass loss and the request floor measured
(`density.py` measures them), each figure against its target, and the pools side by side."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from bench.report import Figure, Target, quantile
from runtime.base import pools

CPU_PER_STEP_MS = Target("<=", 2.0, "issue 18")
THROUGHPUT = Target(">=", 0.9, "issue 18")
RSS_MIB = Target("<=", 400, "issue 18")
RESUME_P50_S = Target("<=", 2.0, "issue 18")
RESUME_MAX_S = Target("<=", 5.0, "issue 18")
ZERO = Target("<=", 0, "issue 18")
# A threads worker's Postgres pool: what a worker of -c 500 is given where Postgres serves
# several (the statements of 500 runs waiting on their models need a handful at once).
DB_POOL_MAX = 100
MODEL_STEPS = 4
# Tool requests per model step of the 4-step agent (a read, a comment, a read, the answer).
TOOL_REQUESTS_PER_STEP = 3 / MODEL_STEPS


@dataclass
class Peaks:
    """What a sampler saw of one worker while a burst ran."""

    rss_mib: float = 0.0
    connections: int = 0
    active: int = 0
    samples: int = 0


@dataclass
class Burst:
    pool: str
    concurrency: int
    runs: int
    seconds: float
    ideal_s: float
    worker_cpu_s: float
    postgres_cpu_s: float
    simulator_cpu_s: float
    idle_cpu_s: float
    start_s: float  # how long the bench took to start every run (within `seconds`)
    peaks: Peaks = field(default_factory=Peaks)
    # Worker CPU per step by part (bench/timings.py KINDS); empty for an untimed worker.
    split_ms: dict[str, float] = field(default_factory=dict)

    @property
    def ratio(self) -> float:
        return self.ideal_s / self.seconds

    @property
    def cpu_ms_per_step(self) -> float:
        return self.worker_cpu_s * 1000 / (self.runs * MODEL_STEPS)

    def cores(self, cpu_s: float) -> float:
        return cpu_s / self.seconds

    def to_json(self) -> dict[str, Any]:
        return {
            "pool": self.pool,
            "concurrency": self.concurrency,
            "runs": self.runs,
            "seconds": round(self.seconds, 3),
            "ideal_s": self.ideal_s,
            "ratio": round(self.ratio, 3),
            "worker_cpu_s": round(self.worker_cpu_s, 3),
            "cpu_ms_per_step": round(self.cpu_ms_per_step, 3),
            "postgres_cpu_s": round(self.postgres_cpu_s, 3),
            "simulator_cpu_s": round(self.simulator_cpu_s, 3),
            "idle_cpu_s": round(self.idle_cpu_s, 3),
            "start_s": round(self.start_s, 3),
            "peak_rss_mib": round(self.peaks.rss_mib, 1),
            "peak_pg_connections": self.peaks.connections,
            "peak_pg_active": self.peaks.active,
            "cpu_ms_per_step_by_part": {k: round(v, 3) for k, v in self.split_ms.items()},
        }


@dataclass
class MassLoss:
    runs: int
    resume_s: list[float]
    lost: int
    duplicates: int
    stale: int
    claimed_s: list[float]

    def to_json(self) -> dict[str, Any]:
        return {
            "runs": self.runs,
            "resume_s": [round(x, 3) for x in sorted(self.resume_s)],
            "claimed_by_death_watch_s": [round(x, 3) for x in sorted(self.claimed_s)],
            "lost": self.lost,
            "duplicates": self.duplicates,
            "stale": self.stale,
        }


@dataclass(frozen=True)
class RequestFloor:
    model_post_ms: float
    tool_get_ms: float

    @property
    def per_step_ms(self) -> float:
        return self.model_post_ms + TOOL_REQUESTS_PER_STEP * self.tool_get_ms


def figures(bursts: list[Burst], mass: MassLoss | None) -> list[Figure]:
    t = bursts[0]
    out = [
        Figure(
            "threads_cpu_ms_per_step",
            f"threads -c {t.concurrency}: worker CPU per model step",
            t.cpu_ms_per_step,
            "ms",
            CPU_PER_STEP_MS,
        ),
        Figure(
            "threads_throughput_ratio",
            f"threads -c {t.concurrency}: throughput vs ideal ({t.runs} runs)",
            t.ratio,
            "x",
            THROUGHPUT,
        ),
        Figure(
            "threads_rss_mib",
            f"threads -c {t.concurrency}: peak RSS",
            t.peaks.rss_mib,
            "MiB",
            RSS_MIB,
            digits=0,
        ),
        Figure(
            "threads_pg_connections",
            f"threads -c {t.concurrency}: peak Postgres connections (its pool's bound)",
            t.peaks.connections,
            "",
            Target("<=", min(DB_POOL_MAX, t.concurrency + pools.MAIN_THREADS), "issue 18"),
            digits=0,
        ),
        Figure(
            "threads_pg_active",
            f"threads -c {t.concurrency}: peak connections inside a statement",
            t.peaks.active,
            "",
            digits=0,
        ),
    ]
    if len(bursts) > 1:
        p = bursts[1]
        out += [
            Figure(
                "prefork_cpu_ms_per_step",
                f"prefork -c {p.concurrency}: worker CPU per model step",
                p.cpu_ms_per_step,
                "ms",
            ),
            Figure(
                "prefork_runs_per_s",
                f"prefork -c {p.concurrency}: runs/s (threads: {t.runs / t.seconds:.1f})",
                p.runs / p.seconds,
                "runs/s",
            ),
            Figure(
                "prefork_rss_mib",
                f"prefork -c {p.concurrency}: peak RSS",
                p.peaks.rss_mib,
                "MiB",
                digits=0,
            ),
        ]
    if mass is not None:
        out += [
            Figure(
                "mass_resume_p50_s",
                f"{mass.runs} runs lost at once: kill to resume p50",
                quantile(mass.resume_s, 0.5),
                "s",
                RESUME_P50_S,
            ),
            Figure(
                "mass_resume_max_s",
                f"{mass.runs} runs lost at once: kill to resume max",
                max(mass.resume_s, default=None),
                "s",
                RESUME_MAX_S,
            ),
            Figure("mass_lost", "runs lost", mass.lost, "", ZERO, digits=0),
            Figure("mass_duplicates", "duplicate writes", mass.duplicates, "", ZERO, digits=0),
            Figure("mass_stale", "writes after a takeover", mass.stale, "", ZERO, digits=0),
        ]
    return out


def floor_figures(floor: RequestFloor) -> list[Figure]:
    return [
        Figure(
            "request_model_post_ms", "one model POST alone: client CPU", floor.model_post_ms, "ms"
        ),
        Figure("request_tool_get_ms", "one tool GET alone: client CPU", floor.tool_get_ms, "ms"),
        Figure(
            "request_per_step_ms",
            f"HTTP alone per model step (1 POST + {TOOL_REQUESTS_PER_STEP:g} GET)",
            floor.per_step_ms,
            "ms",
        ),
    ]


def breakdown_figures(t: Burst, floor: RequestFloor, cores: int) -> list[Figure]:
    """Where the threads worker's CPU per step went (its threads' own counters), and the
    throughput the machine's cores allow at the CPU per step of everything that served it."""
    if not t.split_ms:
        return []
    task = t.split_ms["task threads"]
    steps = t.runs * MODEL_STEPS
    total_ms = (t.worker_cpu_s + t.postgres_cpu_s + t.simulator_cpu_s) * 1000 / steps
    ideal_steps_per_s = steps / t.ideal_s
    label = f"threads -c {t.concurrency}, per model step:"
    return [
        Figure("split_task_ms", f"{label} the task threads", task, "ms"),
        Figure(
            "split_http_ms",
            f"{label} of which HTTP alone (the request floor)",
            floor.per_step_ms,
            "ms",
        ),
        Figure(
            "split_engine_ms",
            f"{label} of which the engine's in-task work",
            task - floor.per_step_ms,
            "ms",
        ),
        Figure(
            "split_main_ms",
            f"{label} Celery's main thread (consumer, timers)",
            t.split_ms["Celery main thread"],
            "ms",
        ),
        Figure(
            "split_background_ms",
            f"{label} liyagent's background threads",
            t.split_ms["background threads"],
            "ms",
        ),
        Figure(
            "split_other_ms",
            f"{label} not by a live thread (ended threads, start-up)",
            t.cpu_ms_per_step - sum(t.split_ms.values()),
            "ms",
        ),
        Figure(
            "machine_cpu_ms_per_step",
            "worker + Postgres + simulators CPU per model step",
            total_ms,
            "ms",
        ),
        Figure(
            "machine_bound_ratio",
            f"throughput vs ideal the machine's {cores} cores allow at that CPU per step",
            min(1.0, cores * 1000 / total_ms / ideal_steps_per_s),
            "x",
        ),
    ]


def matrix(bursts: list[Burst]) -> tuple[list[str], list[list[str]]]:
    columns = [
        "pool",
        "runs",
        "time (ideal)",
        "vs ideal",
        "CPU/step",
        "RSS",
        "PG conns (active)",
        "worker cores",
        "Postgres cores",
        "sim cores",
        "idle cores",
    ]
    rows = [
        [
            f"{b.pool} -c {b.concurrency}",
            str(b.runs),
            f"{b.seconds:.1f} s ({b.ideal_s:g} s)",
            f"{b.ratio:.2f}x",
            f"{b.cpu_ms_per_step:.2f} ms",
            f"{b.peaks.rss_mib:.0f} MiB",
            f"{b.peaks.connections} ({b.peaks.active})",
            f"{b.cores(b.worker_cpu_s):.2f}",
            f"{b.cores(b.postgres_cpu_s):.2f}",
            f"{b.cores(b.simulator_cpu_s):.2f}",
            f"{b.cores(b.idle_cpu_s):.2f}",
        ]
        for b in bursts
    ]
    return columns, rows
