"""Section 5: recovery figures from a short kill-trial run (issue 11's targets, the spec's bound).

Runs `liyagent trials` in-process (liyagent/local/trials.py: victim workers SIGKILLed 0.2-4 s
after they are up while a survivor and beat recover, the product's timings, lease 8 s and sweep
3 s) against the bench's private Postgres and Redis, and reads the verdict: time to end (kill ->
the trial's end, the spec's measure) for every trial caught in flight, time to resume (kill ->
the resumed attempt's first write) when the verdict offers it (`Verdict.resume_s`, issue 11),
and what the judge counted (lost, duplicate and stale writes). The trials' own JSON report and
histogram go beside the bench's.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from rich.console import Console

from bench.lab import Lab
from bench.report import Figure, Section, Target, quantile
from liyagent.cli.trials import RECOVERY_TARGET_S, TRIAL_TIMINGS, TrialsRequest, execute
from liyagent.local.verdict import Verdict

TARGETS = {
    "resume_p50_s": Target("<=", 2.0, "issue 11"),
    "end_p50_s": Target("<=", 4.0, "issue 11"),
    "end_p95_s": Target("<=", 6.0, "issue 11"),
    "end_max_s": Target("<=", RECOVERY_TARGET_S, "the spec (15 s)"),
}
ZERO = Target("<=", 0, "the spec")
# Where the verdict may keep time-to-resume samples (issue 11 adds them).
RESUME_FIELDS = ("resume_s", "time_to_resume_s")


def resume_samples(verdict: Verdict) -> list[float] | None:
    """Time-to-resume samples if the verdict has them (None: not offered)."""
    for name in RESUME_FIELDS:
        found = getattr(verdict, name, None)
        if isinstance(found, list):
            return [float(x) for x in found]
    return None


@contextlib.contextmanager
def _servers(database_url: str, redis_url: str) -> Iterator[None]:
    """The trials harness reads its servers from the environment: point it at the lab's."""
    saved = {k: os.environ.get(k) for k in ("LIYAGENT_DATABASE_URL", "LIYAGENT_REDIS_URL")}
    os.environ["LIYAGENT_DATABASE_URL"] = database_url
    os.environ["LIYAGENT_REDIS_URL"] = redis_url
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def measure_recovery(lab: Lab, trials: int, seed: int | None, report: Path) -> Section:
    """Section 5 (see the module docstring)."""
    t = TRIAL_TIMINGS
    section = Section(
        "recovery",
        f"5. Recovery after SIGKILL: {trials} kill trials (lease {t.lease_ttl_ms / 1000:g} s, "
        f"sweep every {t.sweep_interval_ms / 1000:g} s)",
    )
    database_url = lab.database("bench_trials")
    request = TrialsRequest(
        trials=trials,
        seed=seed,
        report=report,
        database=str(sa.make_url(database_url).database),
    )
    with _servers(database_url, lab.redis_url):
        outcome = execute(request, Console(stderr=True, highlight=False))
    v = outcome.verdict
    end = list(v.recovery_s)
    resume = resume_samples(v)
    figures = []
    if resume is None:
        figures.append(
            Figure(
                "resume_p50_s",
                "time to resume p50",
                None,
                "s",
                TARGETS["resume_p50_s"],
                note="not offered by the verdict (issue 11)",
            )
        )
    else:
        figures.append(
            Figure(
                "resume_p50_s",
                f"time to resume p50 ({len(resume)} samples)",
                quantile(resume, 0.5),
                "s",
                TARGETS["resume_p50_s"],
            )
        )
    for key, q, label in (
        ("end_p50_s", 0.5, "p50"),
        ("end_p95_s", 0.95, "p95"),
        ("end_max_s", 1.0, "max"),
    ):
        value = quantile(end, q)
        note = "no trial caught in flight" if value is None else ""
        figures.append(
            Figure(
                key,
                f"time to end {label} ({len(end)} caught in flight)",
                value,
                "s",
                TARGETS[key],
                note=note,
            )
        )
    figures += [
        Figure("lost", "lost trials", float(len(v.lost)), "", ZERO, digits=0),
        Figure("duplicate_writes", "duplicate writes", float(v.duplicates), "", ZERO, digits=0),
        Figure("stale_writes", "stale writes", float(v.stale_writes), "", ZERO, digits=0),
    ]
    section.figures = figures
    detail: dict[str, Any] = {
        "method": __doc__,
        "verdict": v.to_json(),
        "time_to_end_s": sorted(end),
        "time_to_resume_s": None if resume is None else sorted(resume),
        "trials_report": str(outcome.report),
        "trials_histogram": str(outcome.histogram),
        "lease_ttl_ms": t.lease_ttl_ms,
        "sweep_interval_ms": t.sweep_interval_ms,
    }
    section.detail = detail
    return section
