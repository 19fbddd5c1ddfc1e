"""Recovery time under the kill trials: victims SIGKILLed mid-run, with the product's timings
(lease 8 s, sweep 3 s), against the spec's 15 s target; plus what the judge found.

Runs `liyagent trials` in-process on a throwaway database and Redis namespace; the JSON report
and PNG histogram go to reports/. Exit 1 only if a trial was lost or a write duplicated or stale.
Usage: .venv/bin/python bench/kill_trials.py [--trials 30] [--seed S]
"""

from __future__ import annotations

import argparse
import sys
import uuid

from common import print_table, use_machine_servers
from rich.console import Console

from liyagent.cli.trials import RECOVERY_TARGET_S, TRIAL_TIMINGS, TrialsRequest, execute
from liyagent.local.verdict import Verdict


def recovery_rows(verdict: Verdict) -> list[list[object]]:
    """Recovery quantiles (kill to the trial's end) against the target."""
    rows: list[list[object]] = []
    for label, q in (("p50", 0.5), ("p95", 0.95), ("p99", 0.99), ("max", 1.0)):
        value = verdict.quantile(q)
        met = "-" if value is None else "met" if value <= RECOVERY_TARGET_S else "missed"
        shown = "no trial caught in flight" if value is None else f"{value:.3f}"
        rows.append([f"recovery {label} (s)", shown, f"{RECOVERY_TARGET_S:g} s", met])
    return rows


def judge_rows(verdict: Verdict) -> list[list[object]]:
    """What the judge counted from Postgres and the vendors' records."""
    return [
        ["trials (rounds)", f"{verdict.trials} ({verdict.rounds})", "-", "-"],
        ["caught in flight", verdict.caught_in_flight, "> 0", _ok(verdict.caught_in_flight > 0)],
        ["lost", len(verdict.lost), "0", _ok(not verdict.lost)],
        ["duplicate writes", verdict.duplicates, "0", _ok(not verdict.duplicates)],
        ["stale writes", verdict.stale_writes, "0", _ok(not verdict.stale_writes)],
    ]


def _ok(good: bool) -> str:
    return "met" if good else "missed"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=30, help="trials (default 30)")
    parser.add_argument("--seed", type=int, help="repeat the kill timings of an earlier seed")
    args = parser.parse_args()
    if args.trials < 1:
        parser.error("--trials must be at least 1")
    use_machine_servers()
    request = TrialsRequest(
        trials=args.trials,
        seed=args.seed,
        database=f"liyagent_bench_trials_{uuid.uuid4().hex[:10]}",
        drop_database=True,
    )
    outcome = execute(request, Console(stderr=True, highlight=False))
    v, t = outcome.verdict, TRIAL_TIMINGS
    print_table(
        f"Kill trials: seed {v.seed}, lease {t.lease_ttl_ms / 1000:g} s, sweep every "
        f"{t.sweep_interval_ms / 1000:g} s",
        ["figure", "measured", "target", "result"],
        [*recovery_rows(v), *judge_rows(v)],
    )
    print(f"Report: {outcome.report}  Histogram: {outcome.histogram}")
    correct = not v.lost and not v.duplicates and not v.stale_writes
    return 0 if correct else 1


if __name__ == "__main__":
    sys.exit(main())
