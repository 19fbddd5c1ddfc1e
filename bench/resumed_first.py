"""The flow section: resumed runs first (issue 33), the flow order on and off side by side.

The issue's backlog: two real prefork workers `-c 3` over the bench's private Postgres and
Redis (the product's timings), a backlog of runs of eleven 600 ms steps queued at once, then
one worker SIGKILLed (its whole process group) while its three runs are part done. The figure
is kill -> resumed claim: from the kill (the database's clock) to the claim of each lost run's
next attempt (`runs.claimed_at`). On, resumed runs go to the broker's first priority bucket and
each loss's claim asks a busy run to yield its slot (runtime/flow/order.py, store/losses.py);
off (LIYAGENT_RESUMED_FIRST=false), one first-in first-out queue: a lost run waits behind the
backlog.
"""

from __future__ import annotations

import time
from typing import Any

import sqlalchemy as sa

from bench.lab import Lab
from bench.report import Figure, Section, Target, quantile
from bench.sides import BenchError, LiyagentSide, wait_ended
from runtime.services import holder_of
from store.runs import db_now

TARGETS = {"p50": Target("<=", 2.0, "issue 33"), "max": Target("<=", 5.0, "issue 33")}
SLOTS = 3  # each worker's -c, as in the issue
STEPS = 10
LATENCY_MS = 600
RUNS = 36


def _script() -> list[dict[str, Any]]:
    """A long run: reads, one keyed write, reads, an answer (about 6.6 s)."""
    steps: list[dict[str, Any]] = [
        {
            "calls": [{"id": f"toolu_read_{n}", "tool": "ticket.read", "args": {"ticket": "T"}}],
            "latency_ms": LATENCY_MS,
        }
        for n in range(STEPS)
    ]
    steps[1] = {
        "calls": [{"id": "toolu_incident", "tool": "incident.create", "args": {"title": "Out"}}],
        "latency_ms": LATENCY_MS,
    }
    return [*steps, {"final": "Done.", "latency_ms": LATENCY_MS}]


def _held(engine: sa.Engine, holders: set[str]) -> list[str]:
    with engine.connect() as conn:
        rows = conn.execute(
            sa.text(
                "SELECT CAST(id AS text) AS id FROM runs WHERE status = 'running' AND step >= 1 "
                "AND claimed_by = ANY(CAST(:h AS text[]))"
            ),
            {"h": sorted(holders)},
        ).all()
    return [r.id for r in rows]


def backlog_kill(lab: Lab, runs: int, resumed_first: bool) -> list[float]:
    """One backlog and one kill; kill -> resumed claim of each lost run, in seconds."""
    settings = lab.settings(lab.database("bench_flow"), resumed_first=resumed_first)
    tag = "on" if resumed_first else "off"
    survivor, victim = lab.launch(
        lab.liyagent(f"flow-{tag}-survivor", settings),
        lab.liyagent(f"flow-{tag}-victim", settings),
        concurrency=SLOTS,
    )
    side = LiyagentSide(settings, lab.seal_keys)
    try:
        ids = [side.start(_script()) for _ in range(runs)]
        holders = {holder_of(pid) for pid in [victim.popen.pid, *victim.children()]}
        deadline = time.monotonic() + 60
        while len(lost := _held(side.services.engine, holders)) < SLOTS:
            if time.monotonic() > deadline:
                raise BenchError(f"flow {tag}: the victim never had {SLOTS} runs in flight")
            time.sleep(0.05)
        with side.services.engine.connect() as conn:
            killed_at = db_now(conn)
        victim.kill()
        wait_ended(side, ids, timeout_s=60 + runs * 10)
        with side.services.engine.connect() as conn:
            rows = conn.execute(
                sa.text("SELECT claimed_at FROM runs WHERE id = ANY(CAST(:ids AS uuid[]))"),
                {"ids": lost},
            ).all()
        return sorted((r.claimed_at - killed_at).total_seconds() for r in rows)
    finally:
        side.close()
        lab.stop(survivor)


def measure_flow(lab: Lab, runs: int = RUNS) -> Section:
    """The flow section (see the module docstring)."""
    section = Section(
        "flow",
        f"Resumed runs first: {runs} runs queued, 2 workers -c {SLOTS}, one SIGKILLed "
        "(kill -> resumed claim)",
    )
    samples = {tag: backlog_kill(lab, runs, tag == "on") for tag in ("on", "off")}
    for tag, waits in samples.items():
        for key, q in (("p50", 0.5), ("max", 1.0)):
            section.figures.append(
                Figure(
                    f"{key}_{tag}_s",
                    f"flow order {tag}: kill -> resumed claim {key} ({len(waits)} lost runs)",
                    quantile(waits, q),
                    "s",
                    TARGETS[key] if tag == "on" else None,
                )
            )
    section.detail = {"method": __doc__, "samples_s": samples, "runs": runs}
    return section
