"""Traces in OpenTelemetry, judged from what a real OTLP/HTTP receiver on loopback got from real
Celery workers: one trace per run (run -> attempt -> step -> call), a resumed attempt joining
it with a link to the attempt a SIGKILL took, and nothing exported without an endpoint."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from runtime.base.tracing import RunTrace, attempt_span_id
from tests.support.otlp import ReceivedSpan, Receiver, receiver
from tests.support.scripts import mixed
from tests.support.stack import Stack


@pytest.fixture
def otlp() -> Iterator[Receiver]:
    with receiver() as r:
        yield r


def _traced(stack: Stack, otlp: Receiver) -> None:
    stack.extra_env["OTEL_EXPORTER_OTLP_ENDPOINT"] = otlp.url
    stack.extra_env["OTEL_SERVICE_NAME"] = "liyagent-test"


def _by_name(spans: list[ReceivedSpan], name: str) -> list[ReceivedSpan]:
    return [s for s in spans if s.name == name]


def _children(spans: list[ReceivedSpan], parent: ReceivedSpan, name: str) -> list[ReceivedSpan]:
    return [s for s in spans if s.parent_span_id == parent.span_id and s.name == name]


def _calls(spans: list[ReceivedSpan], step: ReceivedSpan) -> dict[str, tuple[str, str, str]]:
    """The step's call spans by tool: (kind, settlement, step key)."""
    return {
        c.attributes["liyagent.call.tool"]: (
            c.attributes["liyagent.call.kind"],
            c.attributes["liyagent.call.settlement"],
            c.attributes["liyagent.call.key"],
        )
        for c in _children(spans, step, "liyagent.call")
    }


@pytest.mark.kill
def test_a_sigkilled_attempt_and_its_resume_share_one_trace(stack: Stack, otlp: Receiver) -> None:
    """Killed at the second write's mark (step 2): step 1's spans had left before the kill; the
    resumed attempt's spans join the run's trace, its span linked to the lost attempt's, whose
    own span the resume writes; every call span says its kind, step key and settlement."""
    _traced(stack, otlp)
    # A watcher up before the kill (it takes no runs): its death watch sees the victim die,
    # whatever the load, before the lease lapses; the resume's worker may start late.
    stack.worker("watcher", runs=False)
    run_id = stack.kill_at("after_mark:kill:2", lambda: stack.start(mixed("o")))
    stack.worker("survivor")
    stack.beat()
    assert stack.wait(run_id, timeout=60).status == "succeeded"

    trace_id = run_id.replace("-", "")
    spans = otlp.wait_for(trace_id, "liyagent.run")
    assert {s.trace_id for s in spans} == {trace_id}
    run = RunTrace.of(run_id, stack.definition(run_id).trace)
    (root,) = _by_name(spans, "liyagent.run")
    assert root.span_id == run.span_id and root.parent_span_id == ""
    assert root.attributes["liyagent.outcome"] == "succeeded"

    attempts = {s.attributes["liyagent.attempt"]: s for s in _by_name(spans, "liyagent.attempt")}
    assert sorted(attempts) == [1, 2]
    lost, resumed = attempts[1], attempts[2]
    assert lost.span_id == attempt_span_id(run, 1) and resumed.span_id == attempt_span_id(run, 2)
    assert lost.parent_span_id == resumed.parent_span_id == root.span_id
    assert lost.attributes["liyagent.attempt.lost"] is True and lost.status_code == 2
    assert [(lk.trace_id, lk.span_id) for lk in resumed.links] == [(trace_id, lost.span_id)]
    assert resumed.links[0].attributes["reason"] == "lost"

    # The victim exported step 1 (flushed at step 2's boundary) before the kill; step 2 was in
    # flight and is what the kill lost.
    victim_steps = _children(spans, lost, "liyagent.step")
    assert [s.attributes["liyagent.step"] for s in victim_steps] == [1]
    assert victim_steps[0].resource["liyagent.holder"] != resumed.resource["liyagent.holder"]
    step1 = _calls(spans, victim_steps[0])
    keys = _keys(stack, run_id)
    assert step1 == {
        "ticket.read": ("read", "made", step1["ticket.read"][2]),
        "incident.create": ("keyed_write", "made", keys[(1, "incident.create")]),
    }
    assert len(_children(spans, victim_steps[0], "liyagent.model_request")) == 1

    steps = {s.attributes["liyagent.step"]: s for s in _children(spans, resumed, "liyagent.step")}
    assert sorted(steps) == [2, 3, 4]
    assert steps[2].attributes["liyagent.resumed"] is True
    # The comment was marked, never sent: its reader found nothing, so it was not sent again.
    assert _calls(spans, steps[2]) == {
        "issue.comment": ("write", "not_found", keys[(2, "issue.comment")])
    }
    assert _calls(spans, steps[3]) == {"chat.reply": ("write", "made", keys[(3, "chat.reply")])}
    assert _children(spans, steps[4], "liyagent.call") == []
    for n in (3, 4):
        [request] = _children(spans, steps[n], "liyagent.model_request")
        # The OpenTelemetry GenAI usage attributes: what the model server billed for it.
        [billed] = stack.vendor(
            "SELECT prompt_tokens, completion_tokens FROM sim.requests WHERE vendor = 'model' "
            "AND run_id = :r AND call = :n AND status = 200",
            r=run_id,
            n=str(n),
        )
        assert request.attributes["gen_ai.usage.input_tokens"] == billed.prompt_tokens
        assert request.attributes["gen_ai.usage.output_tokens"] == billed.completion_tokens
        assert str(request.attributes["gen_ai.response.model"]).startswith("script-")


def _keys(stack: Stack, run_id: str) -> dict[tuple[int, str], str]:
    rows = stack.rows("SELECT step, tool, idem_key FROM call_marks WHERE run_id = :r", r=run_id)
    return {(r.step, r.tool): r.idem_key for r in rows}


def test_recycled_pool_children_lose_no_span(stack: Stack, otlp: Receiver) -> None:
    """Every pool child is recycled after one task (it exits, billiard-style, without atexit):
    each run's spans all arrive, run span included, with nothing lost to the exits."""
    _traced(stack, otlp)
    stack.worker(pool="prefork", wrap=lambda argv: [*argv, "--max-tasks-per-child=1"])
    runs = [stack.start(mixed(f"p{i}")) for i in range(3)]
    for run_id in runs:
        assert stack.wait(run_id, timeout=60).status == "succeeded"
    for run_id in runs:
        spans = otlp.wait_for(run_id.replace("-", ""), "liyagent.run")
        names = sorted(s.name for s in spans)
        assert names.count("liyagent.step") == 4 and names.count("liyagent.call") == 4
        assert names.count("liyagent.attempt") == 1 and names.count("liyagent.model_request") == 4


def test_without_an_endpoint_nothing_is_exported(stack: Stack, otlp: Receiver) -> None:
    """No OTEL_EXPORTER_OTLP_ENDPOINT: the worker creates no exporter (it never says traces
    are on) and the receiver, which a traced worker of the same test reaches, gets nothing."""
    stack.unset_env |= {"OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"}
    untraced = stack.worker("plain")
    run_id = stack.start(mixed("n"))
    assert stack.wait(run_id, timeout=60).status == "succeeded"
    untraced.kill()
    assert "traces.on" not in untraced.output()
    assert otlp.spans() == [] and otlp.requests == 0

    stack.unset_env.clear()
    _traced(stack, otlp)  # the control: the same run, traced, does reach the receiver
    traced = stack.worker("traced")
    again = stack.start(mixed("m"))
    assert stack.wait(again, timeout=60).status == "succeeded"
    otlp.wait_for(again.replace("-", ""), "liyagent.run")
    assert "traces.on" in traced.output()
    assert otlp.spans(run_id.replace("-", "")) == []
