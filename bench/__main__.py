"""`make bench` / `python -m bench`: every figure of issue 12 (and issue 11's recovery) in one run.

Starts its own Postgres and Redis (private, removed at the end), runs the sections, prints a
table per section with the targets beside the figures, and writes one JSON file and one PNG
chart to --out (default reports/bench/). Exit 0 when every section measured (targets missed
are reported, not an error), 1 when a section could not measure, 3 when the servers cannot
start (the message says what to install), 130 on Ctrl-C.

  python -m bench                      # everything, about 10 minutes on 2 cores
  python -m bench --quick              # a few runs per figure (smoke test, figures are rough)
  python -m bench --only counts --only sweeps
  python -m bench --only flowctl       # limits per model endpoint, on vs off (about 3 minutes)
  python -m bench --only ledger        # the usage ledger's cost per step, on vs off
  python -m bench --only capacity      # what one Postgres core carries (about 5 minutes)
  python -m bench --only workflows     # a Python workflow's step beside an agent's step
"""

from __future__ import annotations

import argparse
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench import (
    capacity,
    counts,
    density,
    flow_control,
    framework_step,
    kill_trials,
    ledger,
    resumed_first,
    settle,
    storage,
    streams,
    sweep_scale,
    takeover,
    tenants,
    throughput,
    workflow_step,
)
from bench.lab import Lab, LabError, open_lab, pg_settings, redis_client
from bench.report import (
    Section,
    commit_facts,
    console,
    load_average,
    machine_facts,
    print_section,
    print_summary,
    write_chart,
    write_json,
)
from runtime.base.settings import Timings

SECTIONS = (
    "throughput",
    "counts",
    "scaling",
    "sweeps",
    "recovery",
    "storage",
    "density",
    "streams",
    "frameworks",
    "takeover",
    "flow",
    "tenants",
    "flowctl",
    "ledger",
    "capacity",
    "workflows",
)
INTERRUPTED = 130
CANNOT_START = 3


@dataclass(frozen=True)
class Options:
    """Everything that sets how much is measured (written to the JSON)."""

    quick: bool
    runs_0ms: int
    runs_50ms: int
    rounds: int
    latency_runs: int
    warmup: int
    count_runs: int
    count_steps: int
    sweep_sizes: tuple[int, ...]
    sweep_samples: int
    trials: int
    seed: int | None
    durable: bool
    timeout_s: float


def options(args: argparse.Namespace) -> Options:
    quick = bool(args.quick)
    return Options(
        quick=quick,
        runs_0ms=args.runs_0ms or (3 if quick else 120),
        runs_50ms=args.runs_50ms or (3 if quick else 80),
        rounds=args.rounds or (1 if quick else 5),
        latency_runs=args.latency_runs or (1 if quick else 15),
        warmup=1 if quick else 4,
        count_runs=args.count_runs or (2 if quick else 20),
        count_steps=4,
        sweep_sizes=tuple(args.sweep_sizes or ((1000,) if quick else (10_000, 100_000))),
        sweep_samples=args.sweep_samples or (3 if quick else 20),
        trials=args.trials or (3 if quick else 18),
        seed=args.seed,
        durable=not args.not_durable,
        timeout_s=120.0,
    )


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench", description=__doc__.splitlines()[0])
    p.add_argument(
        "--only", action="append", choices=SECTIONS, help="run only this section (repeatable)"
    )
    p.add_argument(
        "--quick",
        action="store_true",
        help="a few runs per figure: a smoke test, not figures to quote",
    )
    p.add_argument(
        "--out",
        default="reports/bench",
        help="folder for the JSON and the PNG (default reports/bench)",
    )
    p.add_argument(
        "--runs-0ms", type=int, help="runs per burst at 0 ms model latency (default 120)"
    )
    p.add_argument(
        "--runs-50ms", type=int, help="runs per burst at 50 ms model latency (default 80)"
    )
    p.add_argument(
        "--rounds", type=int, help="rounds of bursts per side (default 5; the median is reported)"
    )
    p.add_argument(
        "--latency-runs", type=int, help="runs one at a time per side for latency (default 15)"
    )
    p.add_argument(
        "--count-runs", type=int, help="runs per agent in the counting section (default 20)"
    )
    p.add_argument(
        "--sweep-sizes",
        type=int,
        nargs="+",
        help="running runs for the sweep section (default 10000 100000)",
    )
    p.add_argument("--sweep-samples", type=int, help="sweeps timed per setting (default 20)")
    p.add_argument("--trials", type=int, help="kill trials for the recovery section (default 18)")
    p.add_argument("--seed", type=int, help="kill-trial seed (repeat a run's kill timings)")
    p.add_argument(
        "--not-durable",
        action="store_true",
        help="Postgres with fsync and synchronous_commit off (the default is production's: on)",
    )
    args = p.parse_args(argv)
    for name in (
        "runs_0ms",
        "runs_50ms",
        "rounds",
        "latency_runs",
        "count_runs",
        "sweep_samples",
        "trials",
    ):
        value = getattr(args, name)
        if value is not None and value < 1:
            p.error(f"--{name.replace('_', '-')} must be at least 1")
    if args.sweep_sizes and min(args.sweep_sizes) < 2000 and not args.quick:
        p.error("--sweep-sizes must be at least 2000 (1,000 of them lapse)")
    return args


def _runners(opts: Options, out_dir: Path, stamp: str) -> dict[str, Callable[[Lab], Section]]:
    tput = throughput.ThroughputOptions(
        runs={0: opts.runs_0ms, 50: opts.runs_50ms},
        rounds=opts.rounds,
        latency_runs=opts.latency_runs,
        timeout_s=opts.timeout_s,
        warmup=opts.warmup,
    )
    return {
        "throughput": lambda lab: throughput.measure_throughput(lab, tput),
        "counts": lambda lab: counts.measure_counts(
            lab,
            opts.count_runs,
            opts.count_steps,
            opts.timeout_s,
            1.5 if opts.quick else settle.IDLE_FLUSH_S,
        ),
        "scaling": lambda lab: throughput.measure_scaling(lab, tput),
        "sweeps": lambda lab: sweep_scale.measure_sweeps(lab, opts.sweep_sizes, opts.sweep_samples),
        "recovery": lambda lab: kill_trials.measure_recovery(
            lab, opts.trials, opts.seed, out_dir / f"kill-trials-{stamp}.json"
        ),
        "storage": lambda lab: storage.measure_storage(lab, storage.StorageOptions.of(opts.quick)),
        "density": lambda lab: density.measure_density(
            lab, density.DensityOptions.quick() if opts.quick else density.DensityOptions()
        ),
        "streams": lambda lab: streams.measure_streams(lab, 100 if opts.quick else streams.STREAMS),
        "frameworks": lambda lab: framework_step.measure_frameworks(
            lab, 50 if opts.quick else framework_step.STEPS
        ),
        "takeover": lambda lab: takeover.measure_takeover(
            lab, 1 if opts.quick else takeover.SAMPLES
        ),
        "flow": lambda lab: resumed_first.measure_flow(
            lab, 12 if opts.quick else resumed_first.RUNS
        ),
        "tenants": lambda lab: tenants.measure_tenants(lab, 10 if opts.quick else tenants.FLOOD),
        "flowctl": lambda lab: flow_control.measure_flow_control(
            lab, 10.0 if opts.quick else flow_control.OFFER_S
        ),
        "ledger": lambda lab: ledger.measure_ledger(
            lab,
            opts.count_runs,
            opts.count_steps,
            opts.timeout_s,
            1.5 if opts.quick else settle.IDLE_FLUSH_S,
        ),
        "capacity": lambda lab: capacity.measure_capacity(
            lab, capacity.CapacityOptions.quick() if opts.quick else capacity.CapacityOptions()
        ),
        "workflows": lambda lab: workflow_step.measure_workflow_step(
            lab, 3 if opts.quick else 15, 2 if opts.quick else 8, opts.timeout_s
        ),
    }


def _server_versions(lab: Lab) -> tuple[str | None, str | None]:
    import sqlalchemy as sa

    with lab.admin() as conn:
        pg = str(conn.execute(sa.text("SHOW server_version")).scalar())
    client = redis_client(lab.redis_url)
    try:
        rd = str(client.info("server").get("redis_version"))
    finally:
        client.close()
    return pg, rd


def run(opts: Options, only: list[str], out_dir: Path) -> int:
    out = console()
    started = datetime.now(UTC)
    stamp = started.strftime("%Y%m%d-%H%M%S")
    commit = commit_facts()
    load_at_start = load_average()
    sections: dict[str, Section] = {}
    versions: tuple[str | None, str | None] = (None, None)
    dirty = " (dirty tree)" if commit["dirty"] else ""
    out.print(
        f"[bold]liyagent bench[/] at {commit['commit'] or '?'}{dirty}: {', '.join(only)}"
        + (" (quick)" if opts.quick else "")
    )
    try:
        with open_lab(opts.durable) as lab:
            versions = _server_versions(lab)
            out.print(
                f"  Postgres {versions[0]} (private, durable={opts.durable}), "
                f"Redis {versions[1]} (private); logs: {lab.base / 'logs'}"
            )
            for key in only:
                t0 = time.monotonic()
                try:
                    section = _runners(opts, out_dir, stamp)[key](lab)
                except KeyboardInterrupt:
                    raise
                except Exception as exc:  # a section that cannot measure says why; the others go on
                    section = Section(key, key, error=f"{type(exc).__name__}: {exc}")
                    section.detail["traceback"] = traceback.format_exc()
                section.seconds = time.monotonic() - t0
                sections[key] = section
                print_section(out, section)
    except KeyboardInterrupt:
        out.print("Interrupted: stopped every process and server the bench started.")
        return INTERRUPTED
    except LabError as exc:
        out.print(f"[bold red]error:[/] {exc}")
        return CANNOT_START
    finished = datetime.now(UTC)
    print_summary(out, list(sections.values()))
    header = f"liyagent bench {stamp} at {(commit['commit'] or '?')[:12]}{dirty}" + (
        " QUICK" if opts.quick else ""
    )
    chart = write_chart(out_dir / f"bench-{stamp}.png", sections, header)
    body: dict[str, Any] = {
        "schema": 1,
        "started_at": started.isoformat(),
        "finished_at": finished.isoformat(),
        "seconds": round((finished - started).total_seconds(), 1),
        **commit,
        "machine": machine_facts(*versions, load_at_start),
        "settings": {
            **asdict(opts),
            "sections": only,
            "postgres_settings": pg_settings(opts.durable),
            "timings": asdict(Timings()),
        },
        "method": {
            "throughput": throughput.__doc__,
            "counts": counts.__doc__,
            "scaling": throughput.__doc__,
            "sweeps": sweep_scale.__doc__,
            "recovery": kill_trials.__doc__,
            "storage": storage.__doc__,
            "density": density.__doc__,
            "streams": streams.__doc__,
            "takeover": takeover.__doc__,
            "flow": resumed_first.__doc__,
            "tenants": tenants.__doc__,
            "flowctl": flow_control.__doc__,
            "ledger": ledger.__doc__,
            "capacity": capacity.__doc__,
            "workflows": workflow_step.__doc__,
        },
        "sections": {k: s.to_json() for k, s in sections.items()},
        "chart": str(chart),
    }
    path = write_json(out_dir / f"bench-{stamp}.json", body)
    out.print(f"JSON: {path}\nChart: {chart}")
    return 1 if any(s.error for s in sections.values()) else 0


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    only = [s for s in SECTIONS if not args.only or s in args.only]
    return run(options(args), only, Path(args.out))


if __name__ == "__main__":
    sys.exit(main())
