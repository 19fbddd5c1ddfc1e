"""A budget as a caller gives it, checked at the door, and the words of a run waiting on one
(runtime/flow/budgets.py): pure, no server."""

from __future__ import annotations

from decimal import Decimal

import pytest

from runtime.base.refused import BadRequest
from runtime.flow.budgets import Budget, BudgetWait, amount_text, decode, parse
from runtime.flow.waiting import said_of, view_of


def test_a_budget_takes_tokens_and_usd_either_or_both() -> None:
    assert parse(None) is None
    assert parse({"tokens": 100}) == Budget(100, None)
    assert parse({"usd": "0.5"}) == Budget(None, Decimal("0.500000000"))
    assert parse({"tokens": "7", "usd": 2}) == Budget(7, Decimal("2.000000000"))
    assert parse({"tokens": 0}) == Budget(0, None)
    assert parse({"tokens": 3, "usd": 1.25}).to_json() == {"tokens": 3, "usd": "1.250000000"}


@pytest.mark.parametrize(
    ("raw", "field"),
    [
        ({"tokens": -1}, "budget.tokens"),
        ({"tokens": 2.5}, "budget.tokens"),
        ({"tokens": "lots"}, "budget.tokens"),
        ({"tokens": True}, "budget.tokens"),
        ({"tokens": None, "usd": -1}, "budget.usd"),
        ({"usd": "1e999999"}, "budget.usd"),
        ({"usd": float("inf")}, "budget.usd"),
        ({"usd": [1]}, "budget.usd"),
        ({"eur": 5}, "budget.eur"),
        ({"tokens": 5, "gbp": 1}, "budget.gbp"),
        ({}, "budget"),
        ("100", "budget"),
    ],
)
def test_a_bad_budget_is_refused_with_its_field_named(raw: object, field: str) -> None:
    with pytest.raises(BadRequest) as refused:
        parse(raw)
    said = str(refused.value)
    assert said.startswith(field) and "nothing was stored" in said, said


def test_a_run_budget_wait_names_the_budget_it_found_short() -> None:
    wait = BudgetWait("run", seen=(amount_text(500), amount_text(Decimal("0E-9"))))
    assert wait.waiting_on() == "budget:run:500:0.000000000"
    assert decode(wait.waiting_on()) == wait
    assert amount_text(None) == "-"
    assert view_of(wait.waiting_on()) == {"reason": "budget", "scope": "run"}
    assert (said_of(wait.waiting_on()) or "").startswith("budget of this run")


def test_an_agent_or_tenant_budget_wait_decodes_with_a_name_holding_colons() -> None:
    wait = BudgetWait("tenant", "acme:eu", "month", 1_767_225_600.0, "1765000000.123456")
    on = wait.waiting_on()
    assert on == "budget:tenant:month:1767225600.000:1765000000.123456:acme:eu"
    assert decode(on) == wait
    assert view_of(on) == {
        "reason": "budget",
        "scope": "tenant",
        "name": "acme:eu",
        "period": "month",
        "until": "2026-01-01T00:00:00+00:00",
    }
    assert "tenant acme:eu per month" in (said_of(on) or "")
    assert decode("budget:team:day:1:2:x") is None
    assert decode("model:p:1.0:closed") is None
