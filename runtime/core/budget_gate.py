"""A model request's check against the budgets its run is under (issue 34, item 4; the words in
runtime/flow/budgets.py, the SQL in store/budgets.py).

Before each request its bound (input estimate + `max_tokens`; in dollars, that bound priced by
the deployment's price table) is reserved against what remains:

- the run's own budget, against its spend kept in process: read once when the attempt starts
  (`store.budgets.attempt_spend`, the one spend rule) and added to as each response arrives, so
  a per-run budget costs no statement per request;
- every agent and tenant budget (per day, per month) it is under, by one conditional UPDATE
  on the shared counters (only for a run under one: the attempt's first read says so).

A bound that does not fit suspends the run on that budget (a run that may not wait fails with
the reason instead). Once answered, the reservation is settled to the response's usage right
after the answer arrives, before the step's own statement: the tenant was billed for the
response whether or not the step is then written, so a step lost before its write still counts
what it was billed, and the step's statement (shared with the ledger) stays as it is. A process
that dies between a reservation and its settlement leaves the reservation spent, never less.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, NoReturn

import sqlalchemy as sa
import structlog

from runtime.base import process
from runtime.core.waiting import Suspend
from runtime.fleet.leases import monotonic_ms
from runtime.flow.budgets import BudgetWait, amount_text
from runtime.models.base import Usage
from runtime.models.prices import PriceTable
from store.budgets import Exhausted, Reservation, any_budgets, attempt_spend, reserve, settle
from store.rows import RunRow

ZERO = Decimal(0)
# How long a worker takes "no agent or tenant budget is set" for a fact before reading it
# again: an attempt that starts this long after a first budget is set is under it.
KNOWN_MS = 5_000


@dataclass
class _Known:
    """Whether the deployment has agent or tenant budgets, as read at `at_ms` (monotonic)."""

    at_ms: int = -KNOWN_MS
    any: bool = True


# Per database: so a run with no budget of its own, in a deployment with no agent or tenant
# budget, costs no statement at all.
_known: process.Cache[str, _Known] = process.Cache("runtime.core.budget_gate", "_known")
# The run event a suspension on a budget is written with is its wait's own (`agent.run.waiting`,
# store/waits.py `suspend`), its details these words.
Fail = Callable[[str, str], NoReturn]


@dataclass(frozen=True)
class Reserved:
    """A request's bound as reserved: `tokens`, `usd`, and its reservation in the shared
    budgets it is under (None: none)."""

    tokens: int
    usd: Decimal
    shared: Reservation | None


class BudgetGate:
    """One attempt's model requests against its run's budgets."""

    def __init__(
        self,
        engine: sa.Engine,
        run: RunRow,
        tenant: str,
        prices: PriceTable,
        model: str | None,
        *,
        may_wait: bool,
        fail: Fail,
        log: structlog.typing.FilteringBoundLogger,
    ) -> None:
        self.engine = engine
        self.run = run
        self.tenant = tenant
        self.prices = prices
        # The model its spec names: what a request's bound is priced at before it is asked.
        self.model = model
        self.may_wait = may_wait
        self.fail = fail
        self.log = log
        self._loaded = False
        self._scoped = False
        # The run's spend so far (tokens; dollars, None while a step of it is unpriced).
        self.spent_tokens = 0
        self.spent_usd: Decimal | None = ZERO

    @property
    def applies(self) -> bool:
        """Whether any budget bounds this run (read once an attempt)."""
        self._load()
        return self._scoped or self.run.budget_tokens is not None or self.run.budget_usd is not None

    def _load(self) -> None:
        """The run's spend and whether a shared budget applies, read once an attempt (not at
        all for a run without a budget of its own while no agent or tenant budget is set)."""
        if self._loaded:
            return
        own = self.run.budget_tokens is not None or self.run.budget_usd is not None
        if not own and not self._deployment_has_budgets():
            self._loaded = True
            return
        with self.engine.connect() as conn:
            spend = attempt_spend(conn, self.run.id, self.run.agent, self.tenant)
        self._scoped = spend.scoped
        for used in spend.by_model:
            self._add(used.model, used.input_tokens, used.output_tokens, used.cached_tokens)
        self._loaded = True

    def _deployment_has_budgets(self) -> bool:
        known = _known.get(str(self.engine.url), _Known)
        now = monotonic_ms()
        if now - known.at_ms >= KNOWN_MS:
            with self.engine.connect() as conn:
                known.any = any_budgets(conn)
            known.at_ms = now
        return known.any

    def _add(self, model: str | None, inputs: int, outputs: int, cached: int) -> Decimal | None:
        """Count a response's tokens in the run's spend; its cost (None: unpriced)."""
        self.spent_tokens += inputs + outputs
        # Priced by the model the response names, else (unpriced under that name: a gateway's
        # `openai/gpt-4o`) by the one it asked for.
        cost = self.prices.cost_usd(model, inputs, outputs, cached) if model else None
        if cost is None:
            cost = self.prices.cost_usd(self.model, inputs, outputs, cached)
        self.spent_usd = None if cost is None or self.spent_usd is None else self.spent_usd + cost
        return cost

    def before(self, step: int, inputs: int, outputs: int) -> Reserved | None:
        """Reserve a request of `step` (`inputs` estimated, `outputs` its max_tokens) against
        every budget of the run: what was reserved, to settle (None: no budget applies), or the
        run suspended (Suspend) on the first budget too short for it."""
        if not self.applies:
            return None
        tokens = inputs + outputs
        priced = self.prices.cost_usd(self.model, inputs, outputs, 0)
        usd = priced if priced is not None else ZERO
        budget = self.run
        if budget.budget_usd is not None and (priced is None or self.spent_usd is None):
            self.fail(
                f"its budget is in US dollars, but its model {self.model!r} has no price in "
                "LIYAGENT_MODEL_PRICES, so a request cannot be priced before it is sent; add "
                "the model's prices, or give the run a budget in tokens",
                "budget_unpriced",
            )
        # The budget as this attempt read it: a raise since is seen by the sweeper.
        seen = BudgetWait(
            "run", seen=(amount_text(budget.budget_tokens), amount_text(budget.budget_usd))
        )
        if budget.budget_tokens is not None and self.spent_tokens + tokens > budget.budget_tokens:
            self._exhausted(seen, step, tokens, usd)
        if (
            budget.budget_usd is not None
            and self.spent_usd is not None
            and self.spent_usd + usd > budget.budget_usd
        ):
            self._exhausted(seen, step, tokens, usd)
        if not self._scoped:
            return Reserved(tokens, usd, None)
        with self.engine.begin() as conn:
            found = reserve(conn, self.run.agent, self.tenant, tokens, priced)
        if isinstance(found, Exhausted) and found.unpriced:
            self.fail(
                f"its {found.scope} {found.name}'s budget per {found.period} is in US dollars, "
                f"but its model {self.model!r} has no price in LIYAGENT_MODEL_PRICES, so a "
                "request cannot be priced before it is sent; add the model's prices",
                "budget_unpriced",
            )
        if isinstance(found, Exhausted):
            wait = BudgetWait(
                found.scope, found.name, found.period, found.ends.timestamp(), found.set_at
            )
            self._exhausted(wait, step, tokens, usd)
        return Reserved(tokens, usd, found)

    def after(self, reserved: Reserved | None, usage: Usage | None, billed: bool) -> None:
        """A request reserved by `before` ended: answered (`usage` its tokens; None when its
        provider said none: its bound counts as spent), failed after it was sent (`billed`: its
        bound counts as spent, it may have been billed) or never sent (nothing spent)."""
        if reserved is None:
            return
        tokens, usd = 0, ZERO
        if usage is not None:
            cost = self._add(
                usage.model, usage.input_tokens, usage.output_tokens, usage.cached_tokens
            )
            tokens = usage.input_tokens + usage.output_tokens
            usd = reserved.usd if cost is None else cost
        elif billed:
            tokens, usd = reserved.tokens, reserved.usd
            self.spent_tokens += tokens
            self.spent_usd = None if self.spent_usd is None else self.spent_usd + usd
        if reserved.shared is not None:
            with self.engine.begin() as conn:
                settle(conn, reserved.shared, tokens, usd)

    def _exhausted(self, wait: BudgetWait, step: int, tokens: int, usd: Decimal) -> NoReturn:
        """Suspend on `wait` (a run that may not wait fails, saying which budget)."""
        details: dict[str, Any] = {
            **wait.view(),
            "step": step,
            "reserve_tokens": tokens,
            "reserve_usd": str(usd),
            "spent_tokens": self.spent_tokens,
            "spent_usd": None if self.spent_usd is None else str(self.spent_usd),
        }
        if wait.scope == "run":
            details.update(
                budget_tokens=self.run.budget_tokens,
                budget_usd=None if self.run.budget_usd is None else str(self.run.budget_usd),
            )
        self.log.info("run.budget_exhausted", **details)
        if not self.may_wait:
            self.fail(
                f"the {wait.said()} cannot take step {step}'s request, and this run cannot "
                "wait; raise the budget and start it again",
                "budget_exhausted",
            )
        raise Suspend(wait.waiting_on(), details)
