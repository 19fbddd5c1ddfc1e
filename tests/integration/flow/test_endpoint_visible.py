"""A run waiting for a model endpoint's capacity says for what (issue 33, item 5), judged with a
real threads worker and the model simulator's 429s: each 429 met is one `rate_limited` event
and one count of liyagent_model_rate_limited_total; each wait in place one `endpoint_wait`
event (never one per slice: at most one per model request the run made, by the simulator's
own records) and one count of liyagent_model_waits_total{how="in_place"}; a long close
suspends the run, and its `waiting` event, the client's view, `inspect` (human and --json) and
liyagent_model_waiting_runs{endpoint,tenant} all say the endpoint, the reason and until when."""

from __future__ import annotations

import json
import os
import signal

import pytest

from liyagent.local.sim_model import lift_model_limit, limit_model
from runtime.core import model_gate
from runtime.ops.events import EventKind, read_events
from tests.integration.cli.test_cli import cli
from tests.integration.flow.test_endpoint_gate import _until
from tests.integration.ops.test_metrics import metrics_once, samples
from tests.support.judge import judge_runs, wait_all
from tests.support.scripts import final
from tests.support.stack import script_tools

RUNS = 6


def _limit(stack, **limit: int) -> None:
    limit_model(stack.sim_url, limit)


def _lift(stack) -> None:
    lift_model_limit(stack.sim_url)


def _scrape(stack, **env: str) -> dict:
    done = metrics_once({**stack.env, **env})
    assert done.returncode == 0, done.stderr
    return samples(done.stdout)


def _events(stack, run: str, kind: EventKind) -> list:
    return [e for e in read_events(stack.engine, run).events if e.kind == kind]


def test_each_429_and_each_wait_in_place_is_one_event_and_one_count(stack) -> None:
    stack.worker("w1", pool="threads", concurrency=RUNS)
    # Two requests a 2 s window; past it a 429 with Retry-After: 2 (a wait in place).
    _limit(stack, requests=2, window_s=2, retry_after_s=2)
    try:
        runs = [
            stack.start([final("Done.", latency_ms=100)], user_input=f"r{i}") for i in range(RUNS)
        ]
        wait_all(stack, runs, timeout=180)
    finally:
        _lift(stack)
    judge_runs(stack, runs).assert_clean()
    requests = stack.vendor(
        "SELECT run_id, status FROM sim.requests WHERE vendor = 'model' AND method = 'POST' "
        "AND run_id = ANY(:runs)",
        runs=runs,
    )
    refused = sum(1 for r in requests if r.status == 429)
    assert refused, "the simulator never answered 429: the limit did not bite"
    limited, waits = 0, 0
    for run in runs:
        met = _events(stack, run, EventKind.RATE_LIMITED)
        waited = _events(stack, run, EventKind.ENDPOINT_WAIT)
        asked = sum(1 for r in requests if str(r.run_id) == run)
        assert len(waited) <= asked, (
            f"run {run}: {len(waited)} wait events for {asked} model requests (one a wait, "
            "never one a slice)"
        )
        for e in met:
            assert e.details == {"endpoint": "sim", "retry_after_s": 2.0, "closed_ms": 2000}
            assert e.step == 1 and e.attempt == 1
        for e in waited:
            d = e.details
            assert (d["endpoint"], d["reason"], d["limit"], d["in_place"]) == (
                "sim",
                "closed",
                None,
                True,
            )
            assert 0 < d["wait_ms"] <= 2000 and d["until"]
        limited += len(met)
        waits += len(waited)
    assert limited == refused, f"{limited} rate_limited events for {refused} 429s"
    assert waits >= 1, "no run waited in place for the closed endpoint"
    (audit,) = stack.rows(
        "SELECT count(*) AS n FROM audit_events WHERE kind = 'agent.run.endpoint_wait'"
    )
    assert audit.n == waits, "one Postgres write a wait"
    scraped = _scrape(stack)
    labels = frozenset({("endpoint", "sim"), ("tenant", "other")})
    assert scraped[("liyagent_model_rate_limited_total", labels)] == refused
    in_place = frozenset({("endpoint", "sim"), ("tenant", "other"), ("how", "in_place")})
    assert scraped[("liyagent_model_waits_total", in_place)] == waits


def test_a_suspended_run_says_what_it_waits_for_in_its_event_inspect_view_and_metrics(
    stack,
) -> None:
    assert model_gate.WAIT_IN_PLACE_MAX_MS < 8_000
    # A worker of a deployment that names the tenant `acme`: the counters it keeps say so.
    named = {"LIYAGENT_TENANT_IN_FLIGHT": "50", "LIYAGENT_TENANT_WEIGHTS": "acme=1"}
    stack.worker("w1", pool="threads", concurrency=2, env=named)
    # A close long enough (20 s) that the run stays suspended while the commands below run.
    _limit(stack, requests=0, window_s=60, retry_after_s=20)
    try:
        steps = [final("Answered after the close.")]
        # Of a tenant other than its owner (`app`): the gauge is by tenant.
        run = stack.client.start_run(
            agent="support-bot",
            model=stack.model(steps),
            user_input="help",
            tools=script_tools(steps),
            tenant="acme",
        )
        _until(lambda: stack.client.get(run).status == "waiting", "the run never suspended")
        view = stack.client.get(run)
        assert view.waiting_for is not None and view.waiting_on is not None
        assert {k: view.waiting_for[k] for k in ("endpoint", "reason", "limit")} == {
            "endpoint": "sim",
            "reason": "closed",
            "limit": None,
        }
        assert view.to_json()["waiting_for"] == view.waiting_for
        (waiting,) = _events(stack, run, EventKind.WAITING)
        d = waiting.details
        assert d["waiting_on"] == view.waiting_on
        assert (d["endpoint"], d["reason"], d["in_place"]) == ("sim", "closed", False)
        assert d["until"] == view.waiting_for["until"], "the event and the view say one time"
        assert d["wait_ms"] > model_gate.WAIT_IN_PLACE_MAX_MS
        assert _events(stack, run, EventKind.RATE_LIMITED), "the 429 it met is an event"
        report = json.loads(cli("inspect", run, "--json", env=stack.env).stdout)
        assert report["run"]["waiting_for"] == view.waiting_for
        wide = {**stack.env, "COLUMNS": "200"}
        human = cli("inspect", run, env=wide).stdout
        assert "Waiting for: model endpoint sim (closed by a 429) until" in human, human
        status = cli("status", run, env=wide).stdout
        assert "Waiting for: model endpoint sim (closed by a 429)" in status, status
        # A tenant the deployment does not name is `other` (no owner's id in the metrics);
        # one it names, by name.
        gauge = frozenset({("endpoint", "sim"), ("tenant", "other")})
        assert _scrape(stack)[("liyagent_model_waiting_runs", gauge)] == 1
        # Should the close run out on a slow host while the commands above run, the run wakes,
        # meets the 429 again and suspends once more. Each suspension is one `waiting`
        # event and one count, so the count lies between the events before and after it.
        before = len(_events(stack, run, EventKind.WAITING))
        scraped = _scrape(stack, **named)
        after = len(_events(stack, run, EventKind.WAITING))
        gauge = frozenset({("endpoint", "sim"), ("tenant", "acme")})
        assert scraped[("liyagent_model_waiting_runs", gauge)] == 1
        # The counters are by tenant too, as the worker that counted them names it: the wait
        # and the 429 it met.
        suspended = frozenset({("endpoint", "sim"), ("tenant", "acme"), ("how", "suspended")})
        assert before <= scraped[("liyagent_model_waits_total", suspended)] <= after
        met = frozenset({("endpoint", "sim"), ("tenant", "acme")})
        assert scraped[("liyagent_model_rate_limited_total", met)] >= 1
        assert not any(
            dict(labels).get("tenant") == "other"
            for name, labels in scraped
            if name in ("liyagent_model_waits_total", "liyagent_model_rate_limited_total")
        ), "the named tenant's counts went to `other`"
    finally:
        _lift(stack)
    wait_all(stack, [run], timeout=60)
    judge_runs(stack, [run]).assert_clean()
    assert stack.client.get(run).waiting_for is None
    assert not any(n == "liyagent_model_waiting_runs" for n, _ in _scrape(stack))


@pytest.mark.kill
def test_a_taken_over_attempt_writes_no_endpoint_event(stack) -> None:
    # Every request is answered 429: the victim stops as it is about to write the event of
    # the first it meets, is taken over (its lease lapses), and on waking is fenced (I3).
    _limit(stack, requests=0, window_s=60, retry_after_s=2)
    victim = stack.worker("victim", fault="before_endpoint_event:stop", pool="threads")
    run = stack.start([final("Answered by the survivor.")])
    stopped_pid = int(stack.fault_hit("victim").split()[1])
    _lift(stack)
    stack.worker("survivor", pool="threads")
    stack.beat()
    view = stack.wait(run, timeout=60)
    assert view.status == "succeeded" and view.attempt == 2 and view.lost_count == 1
    os.kill(stopped_pid, signal.SIGCONT)
    victim.wait_for(r"run\.fenced_out", timeout=30)
    stale = stack.rows(
        "SELECT kind FROM audit_events WHERE run_id = :r AND attempt = 1 AND kind IN "
        "('agent.run.rate_limited', 'agent.run.endpoint_wait')",
        r=run,
    )
    assert stale == [], f"the taken-over attempt wrote {[s.kind for s in stale]}"
