"""Prometheus metrics read at scrape time from Postgres and Redis: after a real crash-resume,
`liyagent metrics --once` and the front's `/metrics` report what the database holds."""

from __future__ import annotations

import signal
import subprocess
import sys
import warnings
from dataclasses import replace

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from starlette.exceptions import StarletteDeprecationWarning

from front.app import create_app
from liyagent.local.procs import ROOT, Proc, python
from runtime import services as runtime_services
from runtime.entries.client import Client
from tests.support.scripts import call, final, mixed, step
from tests.support.stack import RecordingPublisher, services_with

with warnings.catch_warnings():  # see test_front.py: the httpx fallback warning is expected
    warnings.simplefilter("ignore", StarletteDeprecationWarning)
    from starlette.testclient import TestClient

BUCKETS = (1, 2, 3, 5, 8, 13, 21, 34, 55)


def samples(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """Every sample of an exposition by (sample name, labels)."""
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def value(scraped, name: str, **labels: str) -> float:
    return scraped[(name, frozenset(labels.items()))]


def labelled(scraped, name: str, label: str) -> dict[str, float]:
    """One family's samples by the value of its one label."""
    return {dict(k)[label]: v for (n, k), v in scraped.items() if n == name}


def metrics_once(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "liyagent.cli.main", "metrics", "--once"],
        env=env, cwd=ROOT, capture_output=True, text=True, timeout=60,
    )  # fmt: skip


def front_metrics(services) -> str:
    with TestClient(create_app(services)) as client:  # no token: /metrics needs none
        answer = client.get("/metrics")
    assert answer.status_code == 200 and answer.headers["content-type"].startswith("text/plain")
    return answer.text


def count(stack, sql: str, **params) -> int:
    return stack.rows(sql, **params)[0].n


@pytest.mark.kill
def test_crash_resume_figures_match_the_database(stack) -> None:
    stack.worker("victim", fault="after_mark:kill")
    run_id = stack.start(mixed("k"))
    stack.fault_hit("victim")
    stack.procs[-1].popen.wait(timeout=10)
    stack.worker("survivor")
    stack.beat()
    assert stack.wait(run_id, timeout=60).status == "succeeded"

    done = metrics_once(stack.env)
    assert done.returncode == 0, done.stderr
    for scraped in (samples(done.stdout), samples(front_metrics(stack.services))):
        assert_crash_figures(stack, run_id, scraped)


def assert_crash_figures(stack, run_id: str, scraped) -> None:
    audit = {
        a.kind: a.created_at
        for a in stack.rows("SELECT kind, created_at FROM audit_events WHERE run_id = :r", r=run_id)
    }
    assert (
        value(scraped, "liyagent_resumes_total")
        == 1
        == len([k for k in audit if k == "agent.run.crash_resumed"])
    )
    assert value(scraped, "liyagent_losses_total") == 1
    assert value(scraped, "liyagent_handbacks_total") == 0
    assert labelled(scraped, "liyagent_runs", "status") == {
        "queued": 0, "running": 0, "waiting": 0, "answered": 0, "succeeded": 1, "failed": 0,
    }  # fmt: skip
    assert value(scraped, "liyagent_runs_by_kind", kind="agent", status="succeeded") == 1
    marks = stack.rows(
        "SELECT coalesce(settlement, 'sent') AS s, count(*) AS n FROM call_marks GROUP BY 1"
    )
    assert labelled(scraped, "liyagent_settlements_total", "settlement") == {
        m.s: m.n for m in marks
    }
    assert labelled(scraped, "liyagent_settlements_total", "settlement")["resent"] == 1

    took = (audit["agent.run.crash_resumed"] - audit["agent.run.lost"]).total_seconds()
    assert value(scraped, "liyagent_recovery_seconds_count") == 1
    assert value(scraped, "liyagent_recovery_seconds_sum") == pytest.approx(took, abs=1e-3)
    buckets = labelled(scraped, "liyagent_recovery_seconds_bucket", "le")
    assert buckets == {
        **{f"{float(b)}": (1 if took <= b else 0) for b in BUCKETS},
        "+Inf": 1,
    }
    assert labelled(scraped, "liyagent_runs_failed_total", "code") == {}
    fenced = stack.services.redis.get(f"{stack.settings.namespace}metrics:fenced_total")
    assert value(scraped, "liyagent_fencing_rejections_total") == float(fenced or 0)
    sweeps = value(scraped, "liyagent_sweep_duration_seconds_count")
    assert 0 < sweeps <= 1000
    assert 0 < value(scraped, "liyagent_sweep_duration_seconds", quantile="0.5") < 5
    assert labelled(scraped, "liyagent_source_up", "source") == {"postgres": 1, "redis": 1}


PAGE = [step(call("toolu_p", "incident.page", title="Down", severity="sev1")), final("Paged.")]


def test_gauges_and_failure_codes_match_the_database(stack) -> None:
    stack.worker("w1", env={"LIYAGENT_STEP_LIMIT": "1"}, sweeps=False)
    failing = stack.start(mixed("f"))  # two steps under a limit of one: fails step_limit
    waiting = stack.start(PAGE)
    assert stack.wait(failing).status == "failed"
    stack.client.wait(waiting, timeout_s=60, until=frozenset({"waiting"}))
    unpublished = services_with(stack, RecordingPublisher())
    queued = Client(unpublished).start_run(
        agent="support-bot", model=stack.model(PAGE),
        user_input="later", tools=["incident.page"],
    )  # fmt: skip
    stack.services.redis.incrby(f"{stack.settings.namespace}metrics:fenced_total", 2)

    scraped = samples(front_metrics(stack.services))
    assert labelled(scraped, "liyagent_runs", "status") == {
        "queued": 1, "running": 0, "waiting": 1, "answered": 0, "succeeded": 0, "failed": 1,
    }  # fmt: skip
    assert labelled(scraped, "liyagent_waiting_runs", "waiting_on") == {
        "approval": 1, "child": 0, "timer": 0, "model": 0,
    }  # fmt: skip
    assert labelled(scraped, "liyagent_runs_failed_total", "code") == {"step_limit": 1}
    age = stack.rows(
        "SELECT EXTRACT(EPOCH FROM clock_timestamp() - updated_at) AS s FROM runs WHERE id = :r",
        r=queued,
    )[0].s
    assert 0 < value(scraped, "liyagent_queue_age_seconds") <= float(age)
    assert value(scraped, "liyagent_fencing_rejections_total") == 2
    assert value(scraped, "liyagent_sweep_duration_seconds_count") == 0  # no worker sweeps
    assert value(scraped, "liyagent_resumes_total") == 0
    unpublished.redis.close()


def test_a_source_that_is_down_is_reported_not_hidden(stack) -> None:
    dead = replace(stack.settings, redis_url="redis://127.0.0.1:1/0")
    services = runtime_services.build(dead, RecordingPublisher(), sealer=stack.sealer)
    scraped = samples(front_metrics(services))
    assert labelled(scraped, "liyagent_source_up", "source") == {"postgres": 1, "redis": 0}
    assert value(scraped, "liyagent_runs", status="queued") == 0
    assert not [n for n, _ in scraped if n.startswith("liyagent_sweep")]
    services.redis.close()

    done = metrics_once({**stack.env, "LIYAGENT_REDIS_URL": "redis://127.0.0.1:1/0"})
    assert done.returncode == 3 and "cannot reach Redis" in done.stderr and done.stdout == ""
    done = metrics_once(
        {**stack.env, "LIYAGENT_DATABASE_URL": "postgresql+psycopg://x@127.0.0.1:1/x"}
    )
    assert done.returncode == 3 and "cannot use Postgres" in done.stderr and done.stdout == ""


def test_metrics_server_serves_until_terminated(stack, tmp_path) -> None:
    argv = python("-m", "liyagent.cli.main", "metrics", "--port", "0")
    server = Proc("metrics", argv, stack.env, tmp_path / "metrics.log")
    try:
        url = server.wait_for(r"metrics listening on (http://\S+)", timeout=30).group(1)
        scraped = samples(httpx.get(url, timeout=10).text)
        assert value(scraped, "liyagent_runs", status="succeeded") == 0
        assert labelled(scraped, "liyagent_source_up", "source") == {"postgres": 1, "redis": 1}
        server.signal_group(signal.SIGTERM)
        assert server.popen.wait(timeout=10) == 0
    finally:
        server.kill()
