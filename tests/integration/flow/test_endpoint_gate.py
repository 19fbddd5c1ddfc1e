"""A 429 closes the model endpoint for the whole fleet (issue 33, item 3), judged from the
model simulator's own records: two threads workers, runs in flight, the simulator limiting its
chat completions and answering 429 with `Retry-After`. After each 429, no request reaches the
model until its Retry-After has passed, but for those already in flight when the 429 was
answered (those that started within `IN_FLIGHT_S` of it: past the gate before any worker knew,
on a shared, loaded machine); every run ends answered, none failed, no step answered twice."""

from __future__ import annotations

import time
from datetime import timedelta

from liyagent.local.sim_model import lift_model_limit, limit_model
from runtime.core import model_gate
from tests.support.judge import judge_runs, wait_all
from tests.support.scripts import call, final, step

# The simulator's limit: 4 requests a 3 s window, a 429 past it says Retry-After: 3.
LIMIT = {"requests": 4, "window_s": 3, "retry_after_s": 3}
RETRY_AFTER = timedelta(seconds=3)
# A request that started this soon after a 429 may have passed its gate before the worker that
# met the 429 closed the endpoint (the spec's figure is 100 ms; the bound here allows for two
# busy workers on two shared cores and is said in the failure).
IN_FLIGHT_S = timedelta(seconds=1)
RUNS = 12


def _limited(stack) -> None:
    limit_model(stack.sim_url, LIMIT)


def _lift(stack) -> None:
    lift_model_limit(stack.sim_url)


def test_a_429_closes_the_endpoint_for_the_fleet_until_its_retry_after(stack) -> None:
    stack.worker("w1", pool="threads", concurrency=6)
    stack.worker("w2", pool="threads", concurrency=6)
    script = [
        step(call("toolu_a", "ticket.read", ticket="T-1"), latency_ms=200),
        final("Read.", latency_ms=200),
    ]
    _limited(stack)
    try:
        runs = [stack.start(script, user_input=f"read {i}") for i in range(RUNS)]
        wait_all(stack, runs, timeout=180)
    finally:
        _lift(stack)
    judge_runs(stack, runs).assert_clean()
    for run in runs:
        assert stack.asked(run) == {1: 1, 2: 1}, f"run {run}: a step answered twice (I5)"
    requests = stack.vendor(
        "SELECT id, status, created_at FROM sim.requests WHERE vendor = 'model' AND method = "
        "'POST' AND run_id = ANY(:runs) ORDER BY created_at",
        runs=runs,
    )
    refusals = [r for r in requests if r.status == 429]
    assert refusals, "the simulator never answered 429: the limit did not bite"
    for r in refusals:
        sent = [
            q
            for q in requests
            if r.created_at + IN_FLIGHT_S < q.created_at < r.created_at + RETRY_AFTER
        ]
        assert not sent, (
            f"{len(sent)} request(s) reached the model while it was closed by the 429 "
            f"#{r.id} at {r.created_at} (Retry-After {RETRY_AFTER}, in-flight bound "
            f"{IN_FLIGHT_S}): first at {sent[0].created_at}"
        )


def _until(check, what: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, what
        time.sleep(0.1)


def test_a_long_close_suspends_the_run_holding_no_worker_and_it_resumes_when_it_opens(
    stack,
) -> None:
    # Longer than a wait in place: the run suspends on `model:<profile>:<opens at>` (its task
    # ends, no lease), shown as its waiting_on, and the sweeper wakes it once it is open.
    assert model_gate.WAIT_IN_PLACE_MAX_MS < 6_000
    stack.worker("w1", pool="threads", concurrency=2)
    limit = {"requests": 0, "window_s": 60, "retry_after_s": 6}
    limit_model(stack.sim_url, limit)
    try:
        run = stack.start([final("Answered after the close.")])
        _until(lambda: stack.client.get(run).status == "waiting", "the run never suspended")
        view = stack.client.get(run)
        assert view.waiting_on is not None and view.waiting_on.startswith("model:sim:")
        assert not stack.rows("SELECT 1 FROM runs WHERE id = :r AND status = 'running'", r=run), (
            "a suspended run holds no worker"
        )
    finally:
        _lift(stack)
    wait_all(stack, [run], timeout=60)
    judge_runs(stack, [run]).assert_clean()
    assert stack.asked(run) == {1: 1}
    (reason,) = stack.rows("SELECT resume_reason FROM runs WHERE id = :r", r=run)
    assert reason.resume_reason == "wait_over"
