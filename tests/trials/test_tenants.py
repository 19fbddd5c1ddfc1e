"""The tenant trials of issue 33: a tenant offering 100x another's volume cannot push the small
tenant's runs behind its own, and priorities are honoured when runs wait together.

One prefork worker -c 6; each tenant bounded to 2 runs in flight, the big tenant weighted 2 (4
in flight): the fleet's slots cover both bounds, so the small tenant's runs wait only behind
its own. Judged from Postgres (each run's creation and first claim); every run succeeds. The
short flood (25x) runs in `make test`; LIYAGENT_TENANT_FLOOD=100 is the issue's (`make trials`).
"""

from __future__ import annotations

import os
import random
from typing import Any

import pytest

from bench.report import quantile
from runtime.base.tenancy import HIGH, LOW, NORMAL, TenantLimits
from tests.support.judge import wait_all
from tests.support.scripts import final

FLOOD = int(os.environ.get("LIYAGENT_TENANT_FLOOD") or 25)
SMALL_RUNS = 4
SLOTS = 6
LATENCY_MS = 500
# The flood's runs take longer, so that it is still held back (its tenant's 4 slots drain
# about 2.5 runs a second) when the small tenant's runs come after it, however slowly the
# client stores its 100 runs on a loaded host.
FLOOD_LATENCY_MS = 1500


def _start(stack, owner: str, priority: int = NORMAL, latency_ms: int = LATENCY_MS) -> str:
    return stack.client.start_run(
        agent="support-bot",
        model=stack.model([final("ok", latency_ms=latency_ms)]),
        user_input="x",
        owner=owner,
        priority=priority,
    )


def _times(stack, runs: list[str]) -> dict[str, Any]:
    rows = stack.rows(
        "SELECT CAST(id AS text) AS id, created_at, started_at, priority, status FROM runs "
        "WHERE id = ANY(CAST(:ids AS uuid[]))",
        ids=runs,
    )
    return {r.id: r for r in rows}


def _p95(values: list[float]) -> float:
    found = quantile(values, 0.95)
    assert found is not None, "no run to measure"
    return found


def _waits(stack, runs: list[str]) -> list[float]:
    rows = _times(stack, runs)
    assert all(rows[r].status == "succeeded" for r in runs)
    return [(rows[r].started_at - rows[r].created_at).total_seconds() for r in runs]


@pytest.mark.timeout(240 + FLOOD * 4)
def test_a_flooding_tenant_does_not_push_a_small_one_behind(
    stack, publish_figures: list[str]
) -> None:
    stack.reconfigure(tenants=TenantLimits(2, (("big", 2.0),)))
    stack.worker("w1", concurrency=SLOTS)
    # Every pool child warm (imports, connections) before anything is measured.
    wait_all(stack, [_start(stack, f"warm-{i}") for i in range(SLOTS * 2)], timeout=60)
    alone = [_start(stack, "small") for _ in range(SMALL_RUNS)]
    wait_all(stack, alone, timeout=60)
    flood = [_start(stack, "big", latency_ms=FLOOD_LATENCY_MS) for _ in range(FLOOD * SMALL_RUNS)]
    beside = [_start(stack, "small") for _ in range(SMALL_RUNS)]
    held = stack.rows("SELECT count(*) AS n FROM runs WHERE tenant = 'big' AND status = 'waiting'")[
        0
    ].n
    assert held > SLOTS, "the flood was over before the small tenant's runs came"
    wait_all(stack, beside, timeout=60)
    wait_all(stack, flood, timeout=60 + FLOOD * 4)
    waits_alone, waits_beside = _waits(stack, alone), _waits(stack, beside)
    _waits(stack, flood)  # every run of the flood succeeded too
    ratio = _p95(waits_beside) / _p95(waits_alone)
    publish_figures.append(
        f"tenants ({FLOOD}x flood, bound 2, big weighted 2, 1 worker -c {SLOTS}): small tenant "
        f"p95 wait alone {_p95(waits_alone) * 1000:.0f} ms, beside the flood "
        f"{_p95(waits_beside) * 1000:.0f} ms ({ratio:.2f}x, target <= 2x)"
    )
    assert ratio <= 2.0, (waits_alone, waits_beside)


@pytest.mark.timeout(240)
def test_priorities_are_honoured_when_runs_wait_together(stack, publish_figures: list[str]) -> None:
    stack.reconfigure(tenants=TenantLimits(2))
    stack.worker("w1", concurrency=2)
    rng = random.Random(33)
    wanted = [rng.choice((LOW, NORMAL, HIGH)) for _ in range(30)]
    runs = [_start(stack, "t", p) for p in wanted]
    wait_all(stack, runs, timeout=120)
    rows = list(_times(stack, runs).values())
    # A run is admitted when it is stored (room under its tenant's bound) or when a worker
    # admits it (audited): the first is not a choice between waiting runs.
    admitted = {
        a.id: a.created_at
        for a in stack.rows(
            "SELECT CAST(run_id AS text) AS id, created_at FROM audit_events "
            "WHERE kind = 'agent.run.admitted' AND run_id = ANY(CAST(:ids AS uuid[]))",
            ids=runs,
        )
    }
    at = {r.id: admitted.get(r.id, r.created_at) for r in rows}
    both_waiting = honoured = 0
    for a in rows:
        for b in rows:
            if a.priority <= b.priority:
                continue
            # Both waiting at once: each was stored before the other was admitted.
            if a.created_at < at[b.id] and b.created_at < at[a.id]:
                both_waiting += 1
                honoured += at[a.id] <= at[b.id]
    assert both_waiting > 100, "too few runs waited together to judge"
    share = honoured / both_waiting
    publish_figures.append(
        f"priorities (30 runs of one tenant bound 2, 1 worker -c 2): honoured in "
        f"{honoured}/{both_waiting} admissions of runs waiting together ({share:.1%}, "
        "target >= 99 %)"
    )
    assert share >= 0.99
