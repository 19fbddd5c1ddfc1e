"""`make bench` in its quickest mode, end to end: every section measures, and the JSON holds a
number for every figure (the values are not judged: a shared machine is noisy, and the targets
are the bench's to report, never a test's to assert).

The harness runs as five `python -m bench --quick` processes side by side, the kill trials, the
density and takeover sections in one, the flow order's backlog and the tenants in another, the
limits per model endpoint and the usage ledger (each on vs off) and a workflow's step beside an
agent's in a third, the capacity section
(its Postgres pinned to one core) in a fourth and the other sections in the fifth, so the test
stays near a few minutes; each starts and removes its own private Postgres and Redis.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from liyagent.local.procs import ROOT

# The groups' deadline: about 3 minutes alone on 2 cores, longer beside the rest of the suite.
BENCH_DEADLINE_S = 480
pytestmark = [pytest.mark.kill, pytest.mark.timeout(BENCH_DEADLINE_S + 120)]

SECTIONS = {
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
}
GROUPS = (
    ["throughput", "counts", "scaling", "sweeps", "storage", "frameworks"],
    ["recovery", "density", "streams", "takeover"],
    # Mostly waiting on the model's latency (or its limit): their own processes.
    ["flow", "tenants"],
    ["flowctl", "ledger", "workflows"],
    ["capacity"],
)
# A seed whose kill comes 1.2 s after the victim is up, while its runs are in flight.
SEED = "13"
# Figures that may honestly be absent, each with its note saying why.
MAY_BE_ABSENT = {
    ("recovery", "resume_p50_s"),  # until the verdict offers time to resume (issue 11)
    ("recovery", "end_p50_s"),  # no trial caught in flight in one round
    ("recovery", "end_p95_s"),
    ("recovery", "end_max_s"),
    ("capacity", "disk_fsyncs_per_s"),  # pg_test_fsync is in PostgreSQL's server package
    ("capacity", "flush_ms"),  # a quick burst may leave its flushes to the WAL writer
    ("capacity", "flush_steps_per_s"),
}


def _bench(out: Path, sections: list[str]) -> subprocess.Popen[str]:
    argv = [sys.executable, "-m", "bench", "--quick", "--seed", SEED, "--out", str(out)]
    for name in sections:
        argv += ["--only", name]
    env = {k: v for k, v in os.environ.items() if not k.startswith("LIYAGENT_")}
    return subprocess.Popen(
        argv, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )


def test_quick_bench_reports_every_section_with_numbers(tmp_path: Path) -> None:
    runs = [(tmp_path / str(i), _bench(tmp_path / str(i), group)) for i, group in enumerate(GROUPS)]
    # The groups run at once, beside the rest of the suite: one deadline for them all, and every
    # bench still running at the end is stopped (it stops everything it started on SIGTERM).
    deadline = time.monotonic() + BENCH_DEADLINE_S
    said: list[str] = []
    try:
        for _, proc in runs:
            said.append(proc.communicate(timeout=max(1.0, deadline - time.monotonic()))[0])
    finally:
        for _, proc in runs:
            if proc.poll() is None:
                proc.terminate()
                proc.communicate(timeout=60)
    sections: dict[str, dict] = {}
    for (out, proc), output in zip(runs, said, strict=True):
        assert proc.returncode == 0, output[-4000:]
        (report,) = out.glob("bench-*.json")
        body = json.loads(report.read_text())
        assert len(body["commit"]) == 40 and isinstance(body["dirty"], bool)
        assert body["machine"]["cores"] and body["machine"]["postgres"] and body["machine"]["redis"]
        assert body["settings"]["quick"] is True
        assert Path(body["chart"]).stat().st_size > 0
        sections.update(body["sections"])
    assert set(sections) == SECTIONS
    for name, section in sections.items():
        assert section["error"] is None, (name, section["error"])
        assert section["figures"], name
        for key, figure in section["figures"].items():
            value = figure["value"]
            if value is None:
                absent_ok = (name, key) in MAY_BE_ABSENT or key.startswith("death_poll")
                assert absent_ok and figure["note"], (name, key, figure)
                continue
            assert isinstance(value, int | float) and math.isfinite(value), (name, key, value)
    density = sections["density"]["figures"]
    for key in ("threads_cpu_ms_per_step", "mass_resume_p50_s", "mass_lost", "mass_duplicates"):
        assert density[key]["target"] is not None and density[key]["verdict"] in ("PASS", "MISS")
    # What HTTP alone takes of a step is a part of the step's whole CPU.
    floor = density["request_per_step_ms"]["value"]
    assert 0 < floor < density["threads_cpu_ms_per_step"]["value"], density
    # Where the threads worker's CPU per step went, by part (its threads' own counters).
    for key in ("split_task_ms", "split_engine_ms", "split_background_ms", "machine_bound_ratio"):
        assert key in density, key
    workflows = sections["workflows"]["figures"]
    assert workflows["workflow_added_ms"]["verdict"] in ("PASS", "MISS"), workflows
    assert workflows["workflow_step_ms"]["value"] > 0, workflows
    assert 0 < workflows["stop_cut_s"]["value"] < workflows["stop_cut_off_s"]["value"], workflows
    capacity = sections["capacity"]["figures"]
    assert capacity["pg_cpu_ms_per_step"]["value"] > 0, capacity
    assert capacity["xacts_per_step"]["value"] >= 1, capacity
    counts = sections["counts"]["figures"]
    for key in ("read_step_write_statements", "read_step_pg_round_trips", "run_row_writes"):
        assert counts[key]["target"] is not None and counts[key]["verdict"] in ("PASS", "MISS")
    storage = sections["storage"]["figures"]
    for key in ("wal_flat_ratio", "written_to_kept", "rebuild_p50_ms", "soak_growth"):
        assert storage[key]["target"] is not None and storage[key]["verdict"] in ("PASS", "MISS")
    frameworks = sections["frameworks"]["figures"]
    for key in ("pydantic_ai_over_native_ms", "openai_agents_over_native_ms"):
        assert frameworks[key]["target"] is not None and frameworks[key]["verdict"] in (
            "PASS",
            "MISS",
        )
