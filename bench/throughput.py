"""Sections 1 and 3: throughput and added latency against plain Celery, and scaling.

Section 1 runs the issue's agent (5 model steps, 5 calls, 2 of them writes) on one liyagent
worker process and on one plain-Celery worker process (bench/baseline.py), both `-c 2` prefork,
at 0 ms and 50 ms model latency. Per latency: a few warm-up runs per side, then `rounds` rounds
of a burst of N runs per side (sides in ABBA order, so drift on a shared machine does not favour
one), then M runs one at a time per side (interleaved). Throughput = N / (the last run's end -
the moment the first was started); the median over rounds is reported. Latency = a run's end
(database clock) - just before it was started, with nothing else in flight; added ms per step =
(p50 liyagent - p50 baseline) / 5 model steps. "Added worker ms per step" is the same difference
read from throughput: 2 slots x (1/runs_per_s liyagent - 1/runs_per_s baseline) / 5.

Section 3 runs the same agent at 50 ms on one, then two liyagent worker processes (`-c 2`
each) on one queue; ratio = median runs/s with two / median with one.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any

from bench import agents
from bench.lab import Lab
from bench.report import Figure, Section, Target
from bench.sides import BaselineSide, LiyagentSide, Side, burst, create_answers_table, sequential

CONCURRENCY = 2
LATENCIES_MS = (0, 50)
THROUGHPUT_RATIO = Target(">=", 0.9)
ADDED_P50_MS = Target("<=", 3.0)
SCALING_RATIO = Target(">=", 1.8)


@dataclass(frozen=True)
class ThroughputOptions:
    runs: dict[int, int]  # per model latency (ms): runs per burst
    rounds: int
    latency_runs: int
    timeout_s: float
    warmup: int = 4


def _p50(samples: list[float]) -> float:
    return statistics.median(samples)


def _one_latency(
    sides: list[Side], latency_ms: int, opts: ThroughputOptions
) -> dict[str, dict[str, Any]]:
    """Warm-up, rounds of bursts, then sequential runs, for each side at one model latency."""
    steps = agents.five_step(latency_ms)
    runs = opts.runs[latency_ms]
    out: dict[str, dict[str, Any]] = {s.name: {"bursts": [], "latency_s": []} for s in sides}
    for side in sides:
        burst(side, steps, opts.warmup, opts.timeout_s)
    for r in range(opts.rounds):
        for side in sides if r % 2 == 0 else list(reversed(sides)):
            b = burst(side, steps, runs, opts.timeout_s)
            out[side.name]["bursts"].append(
                {
                    "runs": b.runs,
                    "seconds": round(b.seconds, 4),
                    "runs_per_s": round(b.runs_per_s, 3),
                }
            )
    for i in range(opts.latency_runs):
        for side in sides if i % 2 == 0 else list(reversed(sides)):
            out[side.name]["latency_s"] += sequential(side, steps, 1, opts.timeout_s)
    for name, got in out.items():
        got["runs_per_s"] = statistics.median(b["runs_per_s"] for b in got["bursts"])
        got["latency_p50_ms"] = _p50(got["latency_s"]) * 1000
        got["latency_s"] = [round(x, 5) for x in got["latency_s"]]
        out[name] = got
    return out


def measure_throughput(lab: Lab, opts: ThroughputOptions) -> Section:
    """Section 1 (see the module docstring)."""
    section = Section(
        "throughput", "1. Throughput and added latency vs plain Celery (one worker process, -c 2)"
    )
    engine_db = lab.database("bench_tput")
    base_db = lab.database("bench_tput_base", migrated=False)
    create_answers_table(base_db)
    settings = lab.settings(engine_db)
    base_ns, base_queue = f"bench:base:{settings.queue}:", f"{settings.queue}-baseline"
    workers = lab.launch(
        lab.liyagent("tput-liyagent", settings),
        lab.baseline("tput-baseline", base_db, lab.redis_url, base_ns, base_queue),
        concurrency=CONCURRENCY,
    )
    ours = LiyagentSide(settings, lab.seal_keys)
    base = BaselineSide(lab.sim_url, base_db, lab.redis_url, base_ns, base_queue)
    try:
        by_latency = {ms: _one_latency([ours, base], ms, opts) for ms in LATENCIES_MS}
    finally:
        ours.close()
        base.close()
        lab.stop(*workers)
    for ms, got in by_latency.items():
        o, b = got[ours.name], got[base.name]
        ratio = o["runs_per_s"] / b["runs_per_s"]
        added = (o["latency_p50_ms"] - b["latency_p50_ms"]) / agents.MODEL_STEPS
        busy = CONCURRENCY * (1 / o["runs_per_s"] - 1 / b["runs_per_s"]) * 1000 / agents.MODEL_STEPS
        section.figures += [
            Figure(
                f"ours_{ms}ms_runs_per_s", f"liyagent runs/s at {ms} ms", o["runs_per_s"], "runs/s"
            ),
            Figure(
                f"base_{ms}ms_runs_per_s",
                f"plain Celery runs/s at {ms} ms",
                b["runs_per_s"],
                "runs/s",
            ),
            Figure(
                f"ratio_{ms}ms",
                f"throughput ratio liyagent / Celery at {ms} ms",
                ratio,
                "x",
                THROUGHPUT_RATIO if ms == 0 else None,
            ),
            Figure(
                f"ours_{ms}ms_p50_ms",
                f"liyagent p50 run latency at {ms} ms",
                o["latency_p50_ms"],
                "ms",
                digits=1,
            ),
            Figure(
                f"base_{ms}ms_p50_ms",
                f"plain Celery p50 run latency at {ms} ms",
                b["latency_p50_ms"],
                "ms",
                digits=1,
            ),
            Figure(
                f"added_p50_ms_per_step_{ms}ms",
                f"added p50 latency per model step at {ms} ms",
                added,
                "ms",
                ADDED_P50_MS,
            ),
            Figure(
                f"added_busy_ms_per_step_{ms}ms",
                f"added worker time per model step at {ms} ms (from runs/s)",
                busy,
                "ms",
            ),
        ]
    section.detail = {
        "agent": {
            "model_steps": agents.MODEL_STEPS,
            "tool_calls": agents.calls(agents.five_step(0)),
            "writes": 2,
            "script": agents.five_step(0),
        },
        "concurrency": CONCURRENCY,
        "worker_processes": 1,
        "runs_per_burst": opts.runs,
        "rounds": opts.rounds,
        "warmup_runs": opts.warmup,
        "sequential_runs": opts.latency_runs,
        "by_latency_ms": by_latency,
        "baseline": (
            "bench/baseline.py: Celery defaults + task_acks_late, worker_prefetch_multiplier 1, "
            "results ignored; shared pooled httpx client; one autocommit INSERT of the answer"
        ),
    }
    return section


def measure_scaling(lab: Lab, opts: ThroughputOptions) -> Section:
    """Section 3 (see the module docstring)."""
    section = Section(
        "scaling", "3. Scaling: 1 vs 2 liyagent worker processes (-c 2 each), 50 ms model latency"
    )
    settings = lab.settings(lab.database("bench_scale"))
    steps = agents.five_step(50)
    runs = opts.runs[50]
    (one,) = lab.launch(lab.liyagent("scale-1", settings), concurrency=CONCURRENCY)
    side = LiyagentSide(settings, lab.seal_keys)
    two = None
    samples: dict[str, list[float]] = {"1": [], "2": []}
    try:
        burst(side, steps, opts.warmup, opts.timeout_s)
        for r in range(opts.rounds):
            order = ["1", "2"] if r % 2 == 0 else ["2", "1"]
            for n in order:
                if n == "2" and two is None:
                    (two,) = lab.launch(lab.liyagent("scale-2", settings), concurrency=CONCURRENCY)
                    burst(side, steps, opts.warmup, opts.timeout_s)
                if n == "1" and two is not None:
                    lab.stop(two)
                    two = None
                samples[n].append(burst(side, steps, runs, opts.timeout_s).runs_per_s)
    finally:
        side.close()
        lab.stop(one)
        if two is not None:
            lab.stop(two)
    r1, r2 = statistics.median(samples["1"]), statistics.median(samples["2"])
    section.figures = [
        Figure("one_runs_per_s", "1 process: runs/s", r1, "runs/s"),
        Figure("two_runs_per_s", "2 processes: runs/s", r2, "runs/s"),
        Figure("ratio", "2 processes / 1 process", r2 / r1, "x", SCALING_RATIO),
    ]
    section.detail = {
        "runs_per_burst": runs,
        "rounds": opts.rounds,
        "runs_per_s": samples,
        "concurrency_per_process": CONCURRENCY,
    }
    return section
