"""Limits per model endpoint keep the whole fleet under the provider's own (issue 33, item 2),
judged from the model simulator's records: two threads workers, more runs at once than the
simulator's limit allows (without limits they would meet 429s), and the `sim` profile's
`requests_per_minute` set below it. The simulator answers no 429, every run ends answered, no
step is answered twice (I5), and the runs that waited for capacity were never failed for it.

Why 0 is deterministic here: a bucket of R a minute admits at most R + R * t / 60 requests in
any t seconds (a full bucket, then its refill), so at most 9 + 9 * 12 / 60 = 10.8 in any 12 s,
and the simulator allows 12 a 12 s window: over a second of spread between admission and
arrival, on a loaded machine, still fits."""

from __future__ import annotations

import json

from liyagent.local.sim_model import PROFILE, model_limited
from tests.support.judge import judge_runs, wait_all
from tests.support.scripts import call, final, step

# The simulator's limit: 12 requests a 12 s window; a 429 past it says Retry-After: 12.
SIM_LIMIT = {"requests": 12, "window_s": 12, "retry_after_s": 12}
# The profile's: 9 a minute (a full bucket of 9, then one every 6.7 s: some runs wait in
# place, others longer than a wait in place are suspended and woken).
LIMITS = {"requests_per_minute": 9, "in_flight": 6}
RUNS = 8  # two steps each: 16 requests, more than the simulator's 12 at once


def test_the_profiles_limits_keep_the_fleet_under_the_providers(stack) -> None:
    declared = json.loads(stack.settings.model_profiles)
    declared[PROFILE] = {**declared[PROFILE], "limits": LIMITS}
    stack.reconfigure(model_profiles=json.dumps(declared))
    stack.worker("w1", pool="threads", concurrency=4)
    stack.worker("w2", pool="threads", concurrency=4)
    script = [
        step(call("toolu_a", "ticket.read", ticket="T-1"), latency_ms=100),
        final("Read.", latency_ms=100),
    ]
    with model_limited(stack.sim_url, SIM_LIMIT):
        runs = [stack.start(script, user_input=f"read {i}") for i in range(RUNS)]
        wait_all(stack, runs, timeout=240)
    judge_runs(stack, runs).assert_clean()
    for run in runs:
        assert stack.asked(run) == {1: 1, 2: 1}, f"run {run}: a step answered twice (I5)"
    answers = stack.vendor(
        "SELECT status, count(*) AS n FROM sim.requests WHERE vendor = 'model' AND method = "
        "'POST' AND run_id = ANY(:runs) GROUP BY status ORDER BY status",
        runs=runs,
    )
    by_status = {a.status: a.n for a in answers}
    assert by_status.get(429, 0) == 0, f"the simulator answered 429s: {by_status}"
    assert by_status.get(200) == 2 * RUNS, f"every step asked once: {by_status}"
