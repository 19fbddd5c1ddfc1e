"""The tenants section (issue 33): a tenant offering 100x another's volume, with each tenant's
runs in flight bounded (LIYAGENT_TENANT_IN_FLIGHT=2, the big tenant weighted 2) and with no
bound, side by side.

One real prefork worker `-c 6` over the bench's private Postgres and Redis; runs of one 200 ms
step. The small tenant offers 4 runs at once, first alone (the fleet idle, the worker warm),
then right after the big tenant offered 100x its volume at once. The figure is the small
tenant's p95 wait: a run's creation to its first claim (`runs.started_at - created_at`, the
database's clock). Bounded, the broker never holds more than the big tenant's bound of its new
runs (the rest are held in Postgres, runtime/flow/tenants.py), so the small tenant waits only
behind its own; unbounded, it waits behind the flood.
"""

from __future__ import annotations

import sqlalchemy as sa

from bench.lab import Lab
from bench.report import Figure, Section, Target, quantile
from bench.sides import BenchError, LiyagentSide, wait_ended
from runtime.base.tenancy import TenantLimits

SLOTS = 6
SMALL_RUNS = 4
FLOOD = 100
LATENCY_MS = 200
BOUNDED = TenantLimits(2, (("big", 2.0),))
TARGET = Target("<=", 2.0, "issue 33")


def _p95(values: list[float]) -> float:
    found = quantile(values, 0.95)
    if found is None:
        raise BenchError("tenants: no run of the small tenant to measure")
    return found


def _waits(side: LiyagentSide, ids: list[str]) -> list[float]:
    with side.services.engine.connect() as conn:
        rows = conn.execute(
            sa.text(
                "SELECT EXTRACT(EPOCH FROM started_at - created_at) AS s FROM runs "
                "WHERE id = ANY(CAST(:ids AS uuid[]))"
            ),
            {"ids": ids},
        ).all()
    return [float(r.s) for r in rows]


def flood(lab: Lab, limits: TenantLimits, flood: int) -> tuple[list[float], list[float]]:
    """The small tenant's waits alone and beside a flood of `flood`x its volume (seconds)."""
    tag = "on" if limits.on else "off"
    settings = lab.settings(lab.database("bench_tenants"), tenants=limits)
    [worker] = lab.launch(lab.liyagent(f"tenants-{tag}", settings), concurrency=SLOTS)
    side = LiyagentSide(settings, lab.seal_keys)
    steps = [{"final": "ok", "latency_ms": LATENCY_MS}]

    def start(owner: str) -> str:
        model = side.models.spec(steps)
        return str(side.client.start_run(agent="bench", model=model, user_input="x", owner=owner))

    try:
        wait_ended(side, [start(f"warm-{i}") for i in range(SLOTS * 2)], timeout_s=60)
        alone = [start("small") for _ in range(SMALL_RUNS)]
        wait_ended(side, alone, timeout_s=60)
        big = [start("big") for _ in range(flood * SMALL_RUNS)]
        beside = [start("small") for _ in range(SMALL_RUNS)]
        wait_ended(side, [*big, *beside], timeout_s=120 + flood * SMALL_RUNS)
        return _waits(side, alone), _waits(side, beside)
    finally:
        side.close()
        lab.stop(worker)


def measure_tenants(lab: Lab, flood_x: int = FLOOD) -> Section:
    """The tenants section (see the module docstring)."""
    section = Section(
        "tenants",
        f"Tenants: a {flood_x}x flood beside a small tenant, 1 worker -c {SLOTS} (small "
        "tenant's p95 wait, creation -> first claim)",
    )
    samples: dict[str, dict[str, list[float]]] = {}
    for tag, limits in (("on", BOUNDED), ("off", TenantLimits())):
        alone, beside = flood(lab, limits, flood_x)
        samples[tag] = {"alone_s": alone, "beside_s": beside}
        ratio = _p95(beside) / _p95(alone)
        label = "bounded 2 (big weighted 2)" if tag == "on" else "unbounded"
        section.figures += [
            Figure(f"alone_{tag}_ms", f"{label}: p95 wait alone", _p95(alone) * 1000, "ms"),
            Figure(
                f"beside_{tag}_ms", f"{label}: p95 wait beside the flood", _p95(beside) * 1000, "ms"
            ),
            Figure(
                f"ratio_{tag}",
                f"{label}: beside / alone",
                ratio,
                "x",
                TARGET if tag == "on" else None,
            ),
        ]
    section.detail = {"method": __doc__, "samples_s": samples, "flood_x": flood_x}
    return section
