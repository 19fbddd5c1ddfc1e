"""Budgets pause a run instead of overrunning it (issue 34, item 4): a run's own budget, an
agent's and a tenant's per period, each reserved before every model request; an exhausted one
suspends the run on it (never failed), and raising it (or the period turning) lets it finish.
What was spent is judged from the model server's own records (`sim.requests`)."""

from __future__ import annotations

import time
from decimal import Decimal
from typing import Any

import pytest

from runtime.core.enqueue import BadRequest
from runtime.models.prices import as_setting
from store.rows import RunNotFound
from store.scope import Scope
from tests.support.scripts import mixed

# Each request's output bound (the spec's max_tokens): small, so budgets are small.
MAX_TOKENS = 40
# The simulators' scripted models are `script-<digest>`: all priced as `script`.
PRICES = {"script": {"input": 1000, "output": 2000}}


def _model(stack, steps: list[dict[str, Any]]) -> dict[str, Any]:
    return {**stack.model(steps), "max_tokens": MAX_TOKENS}


def _start(stack, tag: str, budget: dict[str, Any] | None, **more: Any) -> str:
    steps = mixed(tag)
    return stack.client.start_run(
        agent="support-bot",
        model=_model(stack, steps),
        user_input="help",
        tools=[c["tool"] for s in steps for c in s.get("calls") or []],
        budget=budget,
        **more,
    )


def _billed(stack, run_id: str) -> int:
    """The tokens the model server billed the run for (every response, lost ones included)."""
    rows = stack.vendor(
        "SELECT coalesce(sum(prompt_tokens + completion_tokens), 0) AS billed FROM sim.requests "
        "WHERE vendor = 'model' AND run_id = :r AND status = 200",
        r=run_id,
    )
    return int(rows[0].billed)


def _waiting(stack, run_id: str, timeout: float = 30.0) -> Any:
    return stack.client.wait(run_id, timeout_s=timeout, until=frozenset({"waiting", "failed"}))


def test_bad_budgets_are_refused_with_the_field_named_and_nothing_stored(stack) -> None:
    cases = [
        ({"tokens": -1}, "budget.tokens"),
        ({"tokens": "many"}, "budget.tokens"),
        ({"tokens": 1.5}, "budget.tokens"),
        ({"usd": -0.01}, "budget.usd"),
        ({"usd": "ten"}, "budget.usd"),
        ({"usd": float("nan")}, "budget.usd"),
        ({"eur": 5}, "budget.eur"),
        ({}, "budget"),
        ([100], "budget"),
    ]
    for budget, field in cases:
        with pytest.raises(BadRequest) as refused:
            _start(stack, "bad", budget)
        assert field in str(refused.value), (budget, str(refused.value))
        assert "nothing was stored" in str(refused.value)
    assert stack.rows("SELECT count(*) AS n FROM runs")[0].n == 0


def test_a_run_waits_on_its_budget_and_finishes_once_it_is_raised(stack) -> None:
    stack.worker("w1")
    stack.beat()
    # Too small for the first request: the run waits before anything is asked.
    run_id = _start(stack, "r", {"tokens": 5})
    view = _waiting(stack, run_id)
    assert view.status == "waiting", view
    assert view.waiting_for == {"reason": "budget", "scope": "run"}
    assert stack.asked(run_id) == {}
    event = stack.rows(
        "SELECT detail FROM audit_events WHERE run_id = :r AND kind = 'agent.run.waiting'",
        r=run_id,
    )[-1].detail
    assert event["waiting_on"] == "budget:run:5:-" and event["budget_tokens"] == 5
    # The run's event stream says it in the same words.
    (said,) = [e for e in stack.client.events(run_id).events if e.kind == "waiting"]
    assert said.details["reason"] == "budget" and said.details["scope"] == "run"
    assert said.details["budget_tokens"] == 5 and said.details["reserve_tokens"] > 5
    assert said.details["spent_tokens"] == 0
    # Another principal's raise finds no such run, and changes nothing.
    with pytest.raises(RunNotFound):
        stack.client.raise_budget(run_id, tokens=100_000, scope=Scope("someone-else"))
    assert stack.client.get(run_id).status == "waiting"
    # Raised to what the first request reserves, not the second (its messages are longer, so
    # its bound is larger): the first is asked, then the run waits again.
    # The first request's reservation, as the engine reckoned it (the ledger's upper bound of
    # what a request may be billed, runtime/core/ledger.py).
    first = int(said.details["reserve_tokens"])
    assert stack.client.raise_budget(run_id, tokens=first + 1) is True
    view = _waiting(stack, run_id)
    assert view.status == "waiting" and view.waiting_for == {"reason": "budget", "scope": "run"}
    assert 0 < _billed(stack, run_id) <= first + 1
    # Raised far enough: it finishes, each step asked once (none lost, none asked again).
    assert stack.client.raise_budget(run_id, tokens=100_000) is True
    assert stack.wait(run_id).status == "succeeded"
    assert stack.asked(run_id) == {1: 1, 2: 1, 3: 1, 4: 1}
    # A raise of a run not waiting wakes nothing.
    assert stack.client.raise_budget(run_id, usd="1.5") is False
    with pytest.raises(BadRequest, match="tokens"):
        stack.client.raise_budget(run_id, tokens=-3)


def test_a_dollar_budget_prices_each_request_before_it_is_sent(stack) -> None:
    stack.extra_env["LIYAGENT_MODEL_PRICES"] = as_setting(PRICES)
    stack.worker("w1")
    stack.beat()
    # Too small for the first request: it waits, saying what that request reserves.
    run_id = _start(stack, "d", {"usd": "0.001"})
    view = _waiting(stack, run_id, timeout=60)
    assert view.status == "waiting" and stack.asked(run_id) == {}
    (said,) = [e for e in stack.client.events(run_id).events if e.kind == "waiting"]
    first = Decimal(said.details["reserve_usd"])
    assert first > Decimal("0.001")
    # Raised past the first request's price: it is asked, then a later one does not fit.
    budget = first * Decimal("1.5")
    assert stack.client.raise_budget(run_id, usd=str(budget)) is True
    view = _waiting(stack, run_id, timeout=60)
    assert view.status == "waiting" and view.waiting_for == {"reason": "budget", "scope": "run"}
    # The wait names the budget as the row holds it: the sweeper leaves it waiting.
    time.sleep(3)
    assert stack.client.get(run_id).attempt == view.attempt
    billed = stack.vendor(
        "SELECT coalesce(sum(prompt_tokens * 1000 + completion_tokens * 2000), 0) / 1e6 AS usd "
        "FROM sim.requests WHERE vendor = 'model' AND run_id = :r AND status = 200",
        r=run_id,
    )[0].usd
    # Every request was asked only when its whole bound fitted: nothing overran.
    assert 0 < billed <= budget
    assert stack.client.raise_budget(run_id, usd=10) is True
    assert stack.wait(run_id).status == "succeeded"


def test_an_agents_daily_budget_is_shared_by_its_runs_and_settled_to_their_usage(stack) -> None:
    limit = 700
    assert stack.client.set_budget(agent="support-bot", period="day", tokens=limit) == []
    stack.worker("w1", concurrency=2)
    stack.beat()
    runs = [_start(stack, f"a{i}", None) for i in range(3)]
    waited = []
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        views = [stack.client.get(r) for r in runs]
        if all(v.status in ("waiting", "succeeded", "failed") for v in views):
            break
        time.sleep(0.2)
    for view in views:
        assert view.status in ("waiting", "succeeded"), view
        if view.status == "waiting":
            waited.append(view)
            found = view.waiting_for
            assert found is not None and found["scope"] == "agent"
            assert (found["name"], found["period"], found["reason"]) == (
                "support-bot",
                "day",
                "budget",
            )
    assert waited, "three runs of four steps fit in 700 tokens"
    billed = sum(_billed(stack, r) for r in runs)
    # The shared counter holds exactly what was billed (each reservation settled to usage),
    # and nothing ran past the limit.
    spent = stack.rows("SELECT spent_tokens FROM budgets")[0].spent_tokens
    assert spent == billed <= limit
    # Raising it wakes the waiting runs at once; each finishes.
    woken = stack.client.set_budget(agent="support-bot", period="day", tokens=100_000)
    assert sorted(woken) == sorted(v.id for v in waited)
    for r in runs:
        assert stack.wait(r).status == "succeeded"
    spent = stack.rows("SELECT spent_tokens FROM budgets")[0].spent_tokens
    assert spent == sum(_billed(stack, r) for r in runs)


def test_a_tenants_budget_wakes_its_runs_when_the_period_turns(stack) -> None:
    stack.client.set_budget(tenant="acme", period="month", tokens=10)
    stack.worker("w1")
    stack.beat()
    run_id = _start(stack, "t", None, tenant="acme")
    view = _waiting(stack, run_id)
    assert view.status == "waiting", view
    assert view.waiting_for is not None
    assert (view.waiting_for["scope"], view.waiting_for["name"]) == ("tenant", "acme")
    assert stack.asked(run_id) == {}
    # Its wait names the budget as it was set: the sweeper leaves it waiting.
    time.sleep(3)
    assert stack.client.get(run_id).attempt == view.attempt
    # The month turns (its end brought to now) and the tenant's limit is now enough: the
    # sweeper wakes the run by its period's end alone.
    with stack.db() as conn:
        conn.exec_driver_sql("UPDATE budgets SET tokens = 100000")
        conn.exec_driver_sql(
            "UPDATE runs SET waiting_on = regexp_replace(waiting_on, "
            "'^(budget:tenant:month:)[0-9.]+', '\\1' || extract(epoch FROM now()) - 1)"
        )
    assert stack.wait(run_id).status == "succeeded"


def test_a_raise_that_no_wake_saw_is_taken_up_by_the_sweeper(stack) -> None:
    """A raise that lands between an attempt's check and its suspension wakes nothing (the run
    was running); the run's wait names the budget it found short, so the sweeper wakes it."""
    stack.client.set_budget(agent="support-bot", period="day", tokens=10)
    stack.worker("w1")
    stack.beat()
    run_id = _start(stack, "s", {"tokens": 5})
    assert _waiting(stack, run_id).waiting_for == {"reason": "budget", "scope": "run"}
    with stack.db() as conn:  # the raise, as it lands unseen: no wake of its own
        conn.exec_driver_sql(f"UPDATE runs SET budget_tokens = 100000 WHERE id = '{run_id}'")
    # Woken, it now finds its agent's budget short, and waits on that.
    view = None
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        view = stack.client.get(run_id)
        if view.status == "waiting" and (view.waiting_for or {}).get("scope") == "agent":
            break
        time.sleep(0.2)
    assert view is not None and (view.waiting_for or {}).get("scope") == "agent", view
    with stack.db() as conn:
        conn.exec_driver_sql("UPDATE budgets SET tokens = 100000, set_at = now()")
    assert stack.wait(run_id).status == "succeeded"


def test_a_dollar_budget_over_an_unpriced_model_fails_the_run_saying_so(stack) -> None:
    """A budget in dollars cannot be kept for a model with no price: the run fails naming the
    model and what to do, and nothing is asked (its cost is unknown, never 0)."""
    stack.client.set_budget(tenant="acme", period="day", usd="5")
    stack.worker("w1")
    run_id = _start(stack, "u", None, tenant="acme")
    view = stack.wait(run_id)
    assert view.status == "failed"
    assert "no price in LIYAGENT_MODEL_PRICES" in (view.failure_reason or ""), view
    assert stack.asked(run_id) == {}
    run_id = _start(stack, "v", {"usd": 1})
    assert "no price" in (stack.wait(run_id).failure_reason or "")
