"""What checkpoints cost: a 200-step scripted run with 10 KB tool results writes about the same
bytes per step at its end as at its start (a record holds only what its step added), keeps in
all about what its conversation holds, and its state is rebuilt from the chain quickly. Driven
through the engine in-process (the real executor, Postgres and Redis; no worker process)."""

from __future__ import annotations

import json
import time
from dataclasses import replace

import pytest

from runtime import services as runtime_services
from runtime.core.deps import AttemptDeps
from runtime.core.enqueue import BadRequest
from runtime.core.executor import run_message
from runtime.durable import chain
from runtime.entries.client import Client
from store.checkpoints import select_step_records
from store.runs import get_run
from tests.support.scripts import call, final, step
from tests.support.stack import RecordingPublisher

STEPS = 200
RESULT_BYTES = 10_000

pytestmark = pytest.mark.timeout(300)


def _services(stack, **changes):
    settings = replace(
        stack.settings,
        tool_modules=(*stack.settings.tool_modules, "tests.support.bulk_tools"),
        step_limit=STEPS + 5,
        **changes,
    )
    return runtime_services.build(settings, RecordingPublisher(), sealer=stack.sealer)


def _script(steps: int, size: int) -> dict:
    return {
        "provider": "scripted",
        "script": {
            "steps": [
                *(
                    step(call(f"toolu_b{i}", "bulk.read", size=size, seed=str(i)))
                    for i in range(steps)
                ),
                final("Read them all."),
            ]
        },
    }


def test_bytes_per_step_stay_flat_and_the_chain_rebuilds(stack, publish_figures) -> None:
    services = _services(stack)
    run_id = Client(services).start_run(
        agent="bulk-reader",
        model=_script(STEPS, RESULT_BYTES),
        user_input="read",
        tools=["bulk.read"],
    )
    assert run_message(AttemptDeps.of(services), run_id, 1) == "succeeded"

    sizes = {
        r.step: r.n
        for r in stack.rows(
            "SELECT step, octet_length(sealed) AS n FROM run_steps WHERE run_id = :r", r=run_id
        )
    }
    assert sorted(sizes) == list(range(1, STEPS + 1))
    first, last = sum(sizes[s] for s in range(1, 21)), sum(sizes[s] for s in range(181, 201))
    # Flat: the last 20 steps wrote within 1.5x of the first 20 (whole-state checkpoints wrote
    # about 10x more by then).
    assert last <= 1.5 * first, (first, last)

    with stack.db() as conn:
        t0 = time.perf_counter()
        run = get_run(conn, run_id)
        records = select_step_records(conn, run_id)
        state = chain.rebuild(stack.sealer, run, records)
        rebuild_ms = (time.perf_counter() - t0) * 1000
    assert state.step == STEPS
    tool_results = [m for m in state.messages if m.get("role") == "tool"]
    # Every result but the last step's (those go to the model, then the answer ends the run).
    assert len(tool_results) == STEPS - 1
    kept = len(json.dumps(state.to_payload()).encode())
    written = sum(sizes.values()) + len(run.checkpoint)
    # Everything written for the run's checkpoints is about what its conversation keeps.
    assert written <= 1.5 * kept, (written, kept)
    publish_figures.append(
        f"step records: steps 1-20 {first} B, steps 181-200 {last} B ({last / first:.2f}x); "
        f"written {written} B for {kept} B kept ({written / kept:.2f}x); "
        f"rebuild of the {STEPS}-step chain {rebuild_ms:.0f} ms (read and verify included)"
    )
    print(publish_figures[-1])
    services.redis.close()


def test_a_tool_result_over_the_limit_is_refused_to_the_model(stack) -> None:
    """A result larger than what its step may still add (LIYAGENT_STEP_MAX_BYTES) is never
    kept: the model reads a refusal naming the limit, and the run goes on."""
    services = _services(stack, step_max_bytes=8192)
    model = {
        "provider": "scripted",
        "script": {
            "steps": [
                step(call("toolu_big", "bulk.read", size=20_000, seed="b")),
                step(call("toolu_small", "bulk.read", size=100, seed="s")),
                final("done"),
            ]
        },
    }
    run_id = Client(services).start_run(
        agent="bulk-reader", model=model, user_input="read", tools=["bulk.read"]
    )
    assert run_message(AttemptDeps.of(services), run_id, 1) == "succeeded"
    (largest,) = stack.rows(
        "SELECT max(octet_length(sealed)) AS n FROM run_steps WHERE run_id = :r", r=run_id
    )
    assert largest.n < 8192
    with stack.db() as conn:
        state = chain.rebuild(
            stack.sealer, get_run(conn, run_id), select_step_records(conn, run_id)
        )
    (told,) = [json.loads(m["content"]) for m in state.messages if m.get("role") == "tool"]
    assert "LIYAGENT_STEP_MAX_BYTES=8192" in told["refused"] and "20012 bytes" in told["refused"]
    services.redis.close()


def test_an_answer_over_the_limit_fails_the_run_unwritten(stack) -> None:
    """A model step that alone asks more than the limit is refused whole: the run fails with
    the reason, nothing of the step is written or made."""
    services = _services(stack, step_max_bytes=8192)
    model = {
        "provider": "scripted",
        "script": {
            "steps": [step(call("toolu_x", "bulk.read", size=1, seed="x" * 10_000)), final()]
        },
    }
    run_id = Client(services).start_run(
        agent="bulk-reader", model=model, user_input="read", tools=["bulk.read"]
    )
    assert run_message(AttemptDeps.of(services), run_id, 1) == "failed"
    view = Client(services).get(run_id)
    assert "LIYAGENT_STEP_MAX_BYTES=8192" in view.failure_reason
    assert stack.rows("SELECT step FROM run_steps WHERE run_id = :r", r=run_id) == []
    audit = stack.rows(
        "SELECT detail FROM audit_events WHERE run_id = :r AND kind = 'agent.run.failed'", r=run_id
    )
    assert [a.detail["code"] for a in audit] == ["step_too_large"]
    services.redis.close()


def test_an_input_over_the_limit_is_a_bad_request(stack) -> None:
    services = _services(stack, step_max_bytes=8192)
    with pytest.raises(BadRequest, match="LIYAGENT_STEP_MAX_BYTES=8192"):
        Client(services).start_run(
            agent="bulk-reader", model=_script(1, 10), user_input="x" * 10_000
        )
    assert stack.rows("SELECT id FROM runs") == []
    services.redis.close()
