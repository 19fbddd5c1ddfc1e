"""Budgets (issue 34, item 4): what a run, an agent or a tenant may spend, in tokens (input and
output, as the provider reports them) and US dollars (the deployment's price table,
runtime/models/prices.py), and the words a run waiting on one is shown in.

A budget is checked before each model request by reserving that request's bound (its input
estimate and its `max_tokens`; in dollars that bound priced) against what remains: a request
is asked only when its whole bound fits, so a run (or a period) overruns its budget only by
what a response used beyond its bound, never by more than one request's reservation. An
exhausted budget suspends the run (status waiting, holding no worker) on
`budget:run:...` (raise it: `Client.raise_budget`, `liyagent budget raise`) or
`budget:<agent|tenant>:<day|month>:...:<name>` (raise it: `liyagent budget set`, or the
sweeper wakes it when the period turns): a run waiting on its budget is never failed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal, InvalidOperation
from typing import Any

from runtime.base.refused import BadRequest
from store.budgets import RUN_WAIT, WAIT_PREFIX

# The keys a budget takes: tokens (a whole number) and US dollars (the one currency priced).
KEYS = ("tokens", "usd")
SCOPES = ("agent", "tenant")
PERIODS = ("day", "month")
# The largest budget taken (tokens; dollars): Postgres's bigint and numeric(18, 9).
MAX_TOKENS = 2**62
MAX_USD = Decimal("999999999")
# What a suspension on a budget records with its event (runtime/core/budget_gate.py), beyond
# the wait's view: the step, the reservation that did not fit, the run's spend, its budget.
WORDS = (
    "step",
    "reserve_tokens",
    "reserve_usd",
    "spent_tokens",
    "spent_usd",
    "budget_tokens",
    "budget_usd",
)


@dataclass(frozen=True)
class Budget:
    """What may be spent: `tokens` (input and output), `usd` (US dollars); None: no bound."""

    tokens: int | None = None
    usd: Decimal | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.tokens is not None:
            out["tokens"] = self.tokens
        if self.usd is not None:
            out["usd"] = str(self.usd)
        return out


def tokens_of(value: Any, field: str) -> int:
    """A token budget: a whole number, 0 or more (BadRequest naming `field` otherwise)."""
    if isinstance(value, bool) or not isinstance(value, int | float | str | Decimal):
        raise BadRequest(f"{field} must be a whole number of tokens, 0 or more; nothing was stored")
    try:
        number = Decimal(str(value).strip())
    except InvalidOperation:
        raise BadRequest(
            f"{field} must be a whole number of tokens, 0 or more; nothing was stored"
        ) from None
    if not number.is_finite() or number != number.to_integral_value() or number < 0:
        raise BadRequest(f"{field} must be a whole number of tokens, 0 or more; nothing was stored")
    if number > MAX_TOKENS:
        raise BadRequest(f"{field} must be at most {MAX_TOKENS}; nothing was stored")
    return int(number)


def usd_of(value: Any, field: str) -> Decimal:
    """A dollar budget: a number, 0 or more, to a billionth (BadRequest naming `field`)."""
    bad = f"{field} must be a number of US dollars, 0 or more; nothing was stored"
    if isinstance(value, bool) or not isinstance(value, int | float | str | Decimal):
        raise BadRequest(bad)
    if isinstance(value, float) and not math.isfinite(value):
        raise BadRequest(bad)
    try:
        number = Decimal(str(value).strip())
    except InvalidOperation:
        raise BadRequest(bad) from None
    if not number.is_finite() or number < 0:
        raise BadRequest(bad)
    if number > MAX_USD:
        raise BadRequest(f"{field} must be at most {MAX_USD}; nothing was stored")
    return number.quantize(Decimal("0.000000001"))


def parse(raw: Any, field: str = "budget") -> Budget | None:
    """A run's budget as a caller gives it (`{"tokens": N, "usd": X}`, either or both; None:
    no budget); BadRequest naming the field that is wrong, an unknown key (another currency)
    included."""
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise BadRequest(
            f'{field} must be an object: {{"tokens": <whole number>, "usd": <US dollars>}} '
            "(either or both); nothing was stored"
        )
    unknown = sorted(str(k) for k in raw if k not in KEYS)
    if unknown:
        raise BadRequest(
            f"{field}.{unknown[0]}: unknown; a budget takes {', '.join(KEYS)} (tokens, and US "
            "dollars: the one currency the price table prices); nothing was stored"
        )
    if not raw:
        raise BadRequest(f"{field} names neither tokens nor usd; nothing was stored")
    tokens = raw.get("tokens")
    usd = raw.get("usd")
    return Budget(
        None if tokens is None else tokens_of(tokens, f"{field}.tokens"),
        None if usd is None else usd_of(usd, f"{field}.usd"),
    )


def amount_text(value: int | Decimal | None) -> str:
    """A budget amount as a `waiting_on` names it: as Postgres prints the column, `-` for none."""
    if value is None:
        return "-"
    return format(value, "f") if isinstance(value, Decimal) else str(value)


@dataclass(frozen=True)
class BudgetWait:
    """A run waiting on a budget: `scope` run, agent or tenant. For a run's, the budget it found
    short (`seen`: tokens, usd as `amount_text` prints them); for an agent's or a tenant's, its
    `name`, `period`, when the period ends (`until`, epoch s) and when its limits were set
    (`set_at`, epoch s as text): a raise since is seen by the sweeper (store/budgets.py)."""

    scope: str
    name: str | None = None
    period: str | None = None
    until: float | None = None
    set_at: str = "0"
    seen: tuple[str, str] = ("-", "-")

    def waiting_on(self) -> str:
        if self.scope == "run":
            return f"{RUN_WAIT}{self.seen[0]}:{self.seen[1]}"
        return f"{WAIT_PREFIX}{self.scope}:{self.period}:{self.until:.3f}:{self.set_at}:{self.name}"

    def _until_iso(self) -> str | None:
        if self.until is None:
            return None
        return datetime.fromtimestamp(self.until, UTC).isoformat(timespec="seconds")

    def view(self) -> dict[str, Any]:
        """What a reader of the run is shown (inspect, the client's `waiting_for`)."""
        out: dict[str, Any] = {"reason": "budget", "scope": self.scope}
        if self.scope != "run":
            out.update(name=self.name, period=self.period, until=self._until_iso())
        return out

    def said(self) -> str:
        """One line for a person: which budget, and what wakes it."""
        if self.scope == "run":
            return "budget of this run (exhausted; raise it: liyagent budget raise RUN)"
        return (
            f"budget of {self.scope} {self.name} per {self.period} (exhausted; the period "
            f"turns at {self._until_iso()}, or raise it: liyagent budget set)"
        )


def decode(waiting_on: str | None) -> BudgetWait | None:
    """The budget wait a `waiting_on` names, or None (another wait, or none)."""
    if not waiting_on or not waiting_on.startswith(WAIT_PREFIX):
        return None
    if waiting_on.startswith(RUN_WAIT):
        seen = waiting_on[len(RUN_WAIT) :].split(":")
        return BudgetWait("run", seen=(seen[0], seen[-1]))
    parts = waiting_on[len(WAIT_PREFIX) :].split(":", 4)
    if len(parts) != 5 or parts[0] not in SCOPES or parts[1] not in PERIODS:
        return None
    try:
        until = float(parts[2])
    except ValueError:
        return None
    return BudgetWait(parts[0], parts[4], parts[1], until, parts[3])
