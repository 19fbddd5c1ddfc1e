"""Usage is recorded with the step that writes it: each written step's tokens equal what the
model server billed for the response it was written from (its own records, `sim.requests`), and
a step asked twice (its first answer never written) counts once. Judged from the simulator's
records against Postgres's and the client's view."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest

from runtime.models import prices
from tests.support.scripts import mixed

# A prompt-cache hit on step 2, as the provider reports it (`prompt_tokens_details`).
CACHED = 7


def _script(tag: str) -> list[dict[str, Any]]:
    steps = mixed(tag)
    steps[1] = {**steps[1], "cached_tokens": CACHED}
    return steps


def _billed(stack, run_id: str) -> list[tuple[int, tuple[int, int, int]]]:
    """Every model response the server billed for the run, in order: (step, its input, output
    and cached tokens)."""
    rows = stack.vendor(
        "SELECT call, prompt_tokens, completion_tokens, cached_tokens FROM sim.requests "
        "WHERE vendor = 'model' AND run_id = :r AND status = 200 ORDER BY id",
        r=run_id,
    )
    return [(int(r.call), (r.prompt_tokens, r.completion_tokens, r.cached_tokens)) for r in rows]


def _recorded(stack, run_id: str) -> dict[int, tuple[int, int, int, str | None]]:
    """Each written step's usage as stored: its step records, and the answer's step."""
    steps = stack.rows(
        "SELECT step, input_tokens, output_tokens, cached_tokens, model FROM run_steps "
        "WHERE run_id = :r ORDER BY step",
        r=run_id,
    )
    out = {s.step: (s.input_tokens, s.output_tokens, s.cached_tokens, s.model) for s in steps}
    run = stack.rows(
        "SELECT step, answer_input_tokens AS i, answer_output_tokens AS o, "
        "answer_cached_tokens AS c, answer_model AS m FROM runs WHERE id = :r",
        r=run_id,
    )[0]
    out[run.step + 1] = (run.i, run.o, run.c, run.m)
    return out


def _check(stack, run_id: str) -> list[tuple[int, tuple[int, int, int]]]:
    """Each written step's usage is what the server billed for the response of it that was
    answered last (the one the written step came from), and the view sums exactly those."""
    billed = _billed(stack, run_id)
    last = dict(billed)  # a step asked again: its last billed response is the written one
    recorded = _recorded(stack, run_id)
    assert sorted(recorded) == sorted(last)
    for n, usage in last.items():
        assert recorded[n][:3] == usage, n
        assert recorded[n][3] is not None and recorded[n][3].startswith("script-")
    assert recorded[2][2] == CACHED
    view = stack.client.get(run_id)
    totals = [sum(u[i] for u in last.values()) for i in range(3)]
    assert (view.usage.input_tokens, view.usage.output_tokens, view.usage.cached_tokens) == (
        *totals,
    )
    shown = view.to_json()["usage"]
    assert (shown["input_tokens"], shown["output_tokens"], shown["cached_tokens"]) == (*totals,)
    return billed


# The deployment's prices (US dollars per million tokens): the simulator's models are named
# `script-<digest>`, priced as `script` (a dated release is priced by its base name).
PRICES = {"script": {"input": 3, "output": 15, "cached_input": 0.3}}


def _cost(usage: tuple[int, int, int]) -> Decimal:
    """What the deployment's prices make of one response's billed tokens."""
    i, o, c = usage
    raw = (i - c) * Decimal(3) + c * Decimal("0.3") + o * Decimal(15)
    return (raw / 1_000_000).quantize(Decimal("0.000000001"))


def test_each_written_step_records_what_the_server_billed(stack) -> None:
    stack.worker("w1", env={"LIYAGENT_MODEL_PRICES": prices.as_setting(PRICES)})
    run_id = stack.start(_script("u"))
    assert stack.wait(run_id, timeout=60).status == "succeeded"
    assert stack.asked(run_id) == {1: 1, 2: 1, 3: 1, 4: 1}
    billed = dict(_check(stack, run_id))
    # Each written step's cost is its billed tokens at the deployment's prices, written with it.
    costs = stack.rows(
        "SELECT step, cost_usd FROM run_steps WHERE run_id = :r "
        "UNION ALL SELECT step + 1, answer_cost_usd FROM runs WHERE id = :r",
        r=run_id,
    )
    assert {c.step: c.cost_usd for c in costs} == {n: _cost(u) for n, u in billed.items()}
    assert stack.client.get(run_id).usage.cost_usd == sum(_cost(u) for u in billed.values())


@pytest.mark.kill
def test_a_step_asked_twice_counts_once(stack) -> None:
    victim = stack.worker("victim", fault="after_model_step:kill")
    run_id = stack.start(_script("k"))
    stack.fault_hit("victim")
    victim.popen.wait(timeout=10)
    stack.worker("survivor")
    stack.beat()
    assert stack.wait(run_id, timeout=60).status == "succeeded"
    assert stack.asked(run_id) == {1: 2, 2: 1, 3: 1, 4: 1}
    billed = _check(stack, run_id)
    # The lost attempt's answer of step 1 was billed too; it is not among the written steps.
    assert [n for n, _ in billed] == [1, 1, 2, 3, 4]
    view = stack.client.get(run_id)
    assert sum(u[0] for _, u in billed[1:]) == view.usage.input_tokens
    # What the lost attempt was billed for step 1 (never written) was recorded by the claim of
    # its loss, as unconfirmed, and covers it; apart from the exact usage above.
    lost = stack.rows(
        "SELECT attempt, step, input_tokens, output_tokens, model FROM usage_unconfirmed "
        "WHERE run_id = :r",
        r=run_id,
    )
    assert [(u.attempt, u.step) for u in lost] == [(1, 1)]
    prompt, completion, _ = billed[0][1]
    assert lost[0].input_tokens >= prompt and lost[0].output_tokens >= completion
    assert lost[0].model is not None and lost[0].model.startswith("script-")
    assert view.usage.unconfirmed_input_tokens == lost[0].input_tokens
