"""A worker that starts alone after the only other one died (issue 33 item 1).

Each sample has a database and a Redis namespace of its own: one prefork worker (`-c 2`, the
product's timings) runs the five-step agent at 1 s model latency; once the run has written its
first step the worker is SIGKILLed (its whole process group, as a lost machine), and a fresh
worker is started. Ready = when its `ready.` line is read (the bench's clock, on the same machine
as Postgres). Ready to next step = ready -> the first model request the simulators recorded for
the run after it (Postgres's clock); ready to claim = ready -> the loss's audit row. Also counted:
runs not succeeded and model steps asked twice (from the simulators' records: a step whose
answer was written is never asked again, I5; the step the victim was waiting on when it died
may be asked again, its answer never written).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import UTC, datetime

import sqlalchemy as sa

from bench import agents
from bench.lab import Lab
from bench.report import Figure, Section, Target, quantile
from bench.sides import LiyagentSide, wait_ended

TARGET = Target("<=", 1.0, "issue 33")
SAMPLES = 3
LATENCY_MS = 1000


@dataclass(frozen=True)
class Sample:
    kill_to_ready_s: float
    ready_to_claim_s: float | None
    ready_to_step_s: float | None
    succeeded: bool
    asked_again: int


def _first_step_written(engine: sa.Engine, run_id: str, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with engine.connect() as conn:
            step = conn.execute(sa.text("SELECT step FROM runs WHERE id = :r"), {"r": run_id})
            if (step.scalar() or 0) >= 1:
                return
        time.sleep(0.05)
    raise RuntimeError(f"run {run_id} never wrote its first step")


def _sample(lab: Lab, n: int, timeout_s: float) -> Sample:
    settings = lab.settings(lab.database("bench_takeover"))
    side = LiyagentSide(settings, lab.seal_keys)
    try:
        (victim,) = lab.launch(lab.liyagent(f"takeover-victim-{n}", settings))
        run_id = side.start(agents.five_step(LATENCY_MS))
        _first_step_written(side.services.engine, run_id)
        killed = datetime.now(UTC)
        victim.kill()
        (fresh,) = lab.launch(lab.liyagent(f"takeover-fresh-{n}", settings))
        ready = datetime.now(UTC)
        wait_ended(side, [run_id], timeout_s)
        lab.stop(fresh)
        with side.services.engine.connect() as conn:
            claimed = conn.execute(
                sa.text(
                    "SELECT min(created_at) FROM audit_events WHERE run_id = :r "
                    "AND kind = 'agent.run.lost'"
                ),
                {"r": run_id},
            ).scalar()
        succeeded = not side.failed([run_id])
    finally:
        side.close()
    engine = sa.create_engine(lab.sim_db_url, hide_parameters=True)
    try:
        with engine.connect() as conn:
            rows = conn.execute(
                sa.text(
                    "SELECT call, created_at FROM sim.requests WHERE vendor = 'model' "
                    "AND run_id = :r AND method = 'POST' ORDER BY id"
                ),
                {"r": run_id},
            ).all()
    finally:
        engine.dispose()
    after = [r.created_at for r in rows if r.created_at > ready]
    calls = [r.call for r in rows]
    return Sample(
        kill_to_ready_s=(ready - killed).total_seconds(),
        ready_to_claim_s=None if claimed is None else (claimed - ready).total_seconds(),
        ready_to_step_s=(after[0] - ready).total_seconds() if after else None,
        succeeded=succeeded,
        # The step in flight at the kill may be asked twice; any other step never.
        asked_again=max(len(calls) - len(set(calls)) - 1, 0),
    )


def measure_takeover(lab: Lab, samples: int = SAMPLES, timeout_s: float = 120.0) -> Section:
    """The takeover section (see the module docstring)."""
    section = Section(
        "takeover",
        f"A worker starting alone after the only one died: {samples} samples "
        f"(model latency {LATENCY_MS} ms, the product's timings)",
    )
    taken = [_sample(lab, n, timeout_s) for n in range(samples)]
    steps = [s.ready_to_step_s for s in taken if s.ready_to_step_s is not None]
    if not steps:
        raise RuntimeError("no run took a model step after the new worker was ready")
    claims = [s.ready_to_claim_s for s in taken if s.ready_to_claim_s is not None]
    section.figures = [
        Figure(
            "ready_to_step_max_s", "worker ready -> next model step, max", max(steps), "s", TARGET
        ),
        Figure(
            "ready_to_step_p50_s", "worker ready -> next model step, p50", quantile(steps, 0.5), "s"
        ),
        Figure("ready_to_claim_p50_s", "worker ready -> claim, p50", quantile(claims, 0.5), "s"),
        Figure(
            "kill_to_ready_p50_s",
            "kill -> new worker ready, p50",
            quantile([s.kill_to_ready_s for s in taken], 0.5),
            "s",
        ),
        Figure(
            "not_succeeded",
            "runs not succeeded",
            sum(not s.succeeded for s in taken),
            "",
            Target("<=", 0, "I1"),
            digits=0,
        ),
        Figure(
            "asked_again",
            "model steps asked again",
            sum(s.asked_again for s in taken),
            "",
            Target("<=", 0, "I5"),
            digits=0,
        ),
    ]
    section.detail = {"samples": [s.__dict__ for s in taken]}
    return section
