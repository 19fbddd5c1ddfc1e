"""The trace context a run is stored with, the ids derived from it, and traces off at no cost."""

from __future__ import annotations

import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from runtime.base import tracing
from runtime.base.tracing import RunTrace, attempt_span_id, new_run_trace
from tests.support.otlp import receiver

ROOT = Path(__file__).resolve().parents[3]


def test_a_run_untraced_at_enqueue_has_a_trace_of_its_own_found_from_its_id() -> None:
    run_id = str(uuid.uuid4())
    stored = new_run_trace(run_id)
    run = RunTrace.of(run_id, stored)
    assert run.trace_id == run_id.replace("-", "") and run.parent_span_id is None
    assert stored["traceparent"] == f"00-{run.trace_id}-{run.span_id}-01"
    # A run stored before traces were: the same context, derived from its id alone.
    assert RunTrace.of(run_id, None) == run
    ids = [attempt_span_id(run, n) for n in (1, 2, 3)]
    assert len({*ids, run.span_id}) == 4 and all(len(i) == 16 for i in ids)
    assert ids == [attempt_span_id(RunTrace.of(run_id, stored), n) for n in (1, 2, 3)]


def test_a_run_enqueued_inside_a_traced_span_joins_the_callers_trace() -> None:
    from opentelemetry.sdk.trace import TracerProvider

    tracer = TracerProvider().get_tracer("app")
    run_id = str(uuid.uuid4())
    with tracer.start_as_current_span("request") as span:
        stored = new_run_trace(run_id)
    caller = span.get_span_context()
    run = RunTrace.of(run_id, stored)
    assert run.trace_id == format(caller.trace_id, "032x")
    assert run.parent_span_id == format(caller.span_id, "016x")
    assert run.span_id == RunTrace.of(run_id, None).span_id


def test_off_helpers_are_one_shared_null_context() -> None:
    """Off, a step or call costs no object: every helper hands back the same null context."""
    off = tracing.OFF
    assert not off.on and off.attempt is not None
    assert off.step(1) is off.step(2, resumed=True) is off.call("t", 0, "c") is off.model_request(1)
    off.flush()
    off.call_key("k")
    off.settled(None, "write", "made")


def test_without_an_endpoint_no_sdk_is_imported() -> None:
    """A worker's whole import graph and its services' tracing, with no endpoint: neither the
    trace SDK nor an exporter is loaded, and the tracing is `OFF` (redis-py loads the metrics
    SDK on its own when it is installed; that is not ours)."""
    code = (
        "import sys, tasks, tasks.lifecycle\n"
        "from runtime.base import tracing\n"
        "assert tracing.from_env('h') is tracing.OFF\n"
        "print(sorted(m for m in sys.modules if m.startswith("
        "('opentelemetry.sdk.trace', 'opentelemetry.exporter'))))\n"
    )
    env = {"PATH": "/usr/bin:/bin", "LIYAGENT_ENV": "test"}
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


def test_an_endpoint_without_the_sdk_is_refused_saying_what_to_do(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318")
    monkeypatch.setitem(sys.modules, "opentelemetry.exporter.otlp.proto.http.trace_exporter", None)
    with pytest.raises(tracing.TracesUnavailable, match=r"liyagent\[otel\]"):
        tracing.check_installed()
    monkeypatch.setenv("OTEL_SDK_DISABLED", "true")
    tracing.check_installed()  # disabled: traces are not asked for


def test_a_slow_collector_pauses_the_flushes_at_boundaries(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A flush slower than its budget turns blocking flushes off for a while: a step never
    waits on a collector twice; its spans still go by the batch schedule."""
    with receiver() as otlp:
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", otlp.url)
        monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "600000")  # only flushes export here
        traced = tracing.from_env("h")
        try:
            with traced.step(1):
                pass
            otlp.delay_s = tracing.FLUSH_BUDGET_S + 0.2
            traced.flush()
            assert otlp.requests == 1
            with traced.step(2):
                pass
            traced.flush()  # paused: returns at once, nothing sent by it
            assert otlp.requests == 1
            otlp.delay_s = 0.0
            traced._paused_until = 0.0  # the pause is over
            traced.flush()
            assert otlp.requests == 2
            assert [s.attributes["liyagent.step"] for s in otlp.spans()] == [1, 2]
        finally:
            traced.shutdown()


@pytest.mark.parametrize("dead", [True, False], ids=["process-died", "lease-lapsed"])
def test_a_lost_attempts_span_is_written_by_the_next_only_when_its_process_died(
    monkeypatch: pytest.MonkeyPatch, dead: bool
) -> None:
    """A loss seen as a death (connections closed, pool child died): nobody else will end the
    lost attempt's span, so the next attempt writes it, and sends it before its own work. A
    loss seen by its lease lapsing may be a stalled or failed attempt that ends its own span:
    the next attempt only links to it, so no span id is written twice."""
    from datetime import UTC, datetime, timedelta

    from runtime.base.tracing import AttemptFacts

    with receiver() as otlp:
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", otlp.url)
        monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "600000")  # only flushes export here
        traced = tracing.from_env("h")
        run_id = str(uuid.uuid4())
        now = datetime.now(tz=UTC)
        facts = AttemptFacts(
            run_id=run_id, agent="a", kind="agent", attempt=2, trace=None, resume_reason="lost",
            created_at=now - timedelta(seconds=5), lost_at=now - timedelta(seconds=1),
            lost_checkpoint_at=now - timedelta(seconds=3), lost_dead=dead,
        )  # fmt: skip
        try:
            span = traced.attempt(facts)
            assert span is not None
            # Sent before the attempt does anything: only the lost one, if any.
            lost = [s for s in otlp.spans() if s.attributes.get("liyagent.attempt.lost")]
            assert len(lost) == (1 if dead else 0)
            span.end("succeeded", run_ended=False)
            traced.flush()
            ids = [s.span_id for s in otlp.spans()]
            assert len(ids) == len(set(ids)) == (2 if dead else 1)
        finally:
            traced.shutdown()
