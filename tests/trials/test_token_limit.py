"""The token-limit trial of issue 33: offered load at twice a model endpoint's input tokens per
minute, the model server limiting them as a provider does (simulators/token_limit.py: a bucket
of LIMIT refilled over a minute, a 429 past it) and the profile declaring the same limit.

Offered load: runs asking the provider's whole bucket at once (what a minute of idleness
leaves), then runs arriving at twice the limit (their steps' tokens, as the model server
counts them) for TRIAL_S seconds; the minute is a real one, so the engine's buckets and the
provider's are the same. Judged from the model server's own records: 429s at most 1 % of
requests; throughput at least 95 % of what the provider allowed over the trial (its bucket,
then its refill over the span from the first request to the last, and, for a trial of two
minutes or more, every whole minute past the first); no run failed; no step asked twice.

The short trial runs in `make test`; `make trials` runs LIYAGENT_TPM_TRIAL_S=120.
"""

from __future__ import annotations

import json
import os
import time

import pytest

from liyagent.local.sim_model import PROFILE, model_limited
from liyagent.local.token_load import SCRIPT, Load, allowance, minute_windows
from runtime.flow.limits import in_flight_key, limits_key
from tests.support.judge import judge_runs, wait_all

pytestmark = pytest.mark.kill

TRIAL_S = float(os.environ.get("LIYAGENT_TPM_TRIAL_S") or 10)
# Input tokens a minute, the provider's and the profile's.
LIMIT = int(os.environ.get("LIYAGENT_TPM_LIMIT") or 24_000)


def set_limits(stack, limits: dict[str, int]) -> None:
    """The simulators' profile declares `limits`, for every process started after."""
    declared = json.loads(stack.settings.model_profiles)
    declared[PROFILE] = {**declared[PROFILE], "limits": limits}
    stack.reconfigure(model_profiles=json.dumps(declared))


def tokens_of(stack, run: str) -> int:
    """A run's input tokens answered, by the model server's own count."""
    (row,) = stack.vendor(
        "SELECT sum(prompt_tokens) AS n FROM sim.requests WHERE run_id = :r AND status = 200",
        r=run,
    )
    return int(row.n)


@pytest.mark.timeout(240 + TRIAL_S * 3)
def test_twice_the_token_limit_offered_is_served_at_the_limit(
    stack, publish_figures: list[str]
) -> None:
    set_limits(stack, {"input_tokens_per_minute": LIMIT})
    stack.worker("w1", pool="threads", concurrency=4)
    stack.worker("w2", pool="threads", concurrency=4)
    load = Load(stack.client, stack.model(SCRIPT), LIMIT, per_run=0)
    # One run asked before the limits bite: a run's input tokens, by the model server's count.
    # Its charge on the engine's buckets is then dropped: both start full, as the provider's.
    calibration = load.start_one("calibration")
    wait_all(stack, [calibration], timeout=60)
    load.per_run = tokens_of(stack, calibration)
    time.sleep(0.5)  # its settlement flushed (limits.FLUSH_S)
    ns = stack.settings.namespace
    stack.services.redis.delete(limits_key(ns, PROFILE), in_flight_key(ns, PROFILE))
    sim_limit = {"input_tokens": LIMIT, "window_s": 60}
    with model_limited(stack.sim_url, sim_limit):
        offering = load.offer()
        time.sleep(TRIAL_S)
        load.stop.set()
        offering.join()
        runs = load.runs[1:]
        wait_all(stack, runs, timeout=120 + TRIAL_S * 2)
    judge_runs(stack, runs).assert_clean()
    for run in runs:
        assert stack.asked(run) == {1: 1, 2: 1}, f"run {run}: a step asked twice (I5)"
    sent = stack.vendor(
        "SELECT status, prompt_tokens, created_at FROM sim.requests WHERE vendor = 'model' "
        "AND method = 'POST' AND run_id = ANY(:runs) ORDER BY created_at",
        runs=runs,
    )
    refused = sum(1 for r in sent if r.status == 429)
    answered, allowed, span = allowance(sent, LIMIT)
    minutes = minute_windows(sent, LIMIT)
    publish_figures.append(
        f"token-limit trial ({len(runs)} runs of {load.per_run} input tokens, {LIMIT} a minute, "
        f"offered 2x for {TRIAL_S:g} s): {answered} tokens answered in {span:.1f} s, "
        f"{answered / allowed:.1%} of the provider's allowance ({allowed:.0f}); "
        f"429s {refused} of {len(sent)} requests ({refused / len(sent):.2%})"
        + (
            f"; whole minutes past the first: {', '.join(f'{m:.1%}' for m in minutes)}"
            if minutes
            else ""
        )
    )
    assert refused <= 0.01 * len(sent), f"{refused} 429s of {len(sent)} requests"
    assert answered >= 0.95 * allowed, f"{answered} tokens answered of {allowed:.0f} allowed"
    assert all(m >= 0.95 for m in minutes), f"a whole minute under 95 %: {minutes}"
