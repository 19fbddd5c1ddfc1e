"""Raising and setting budgets (issue 34, item 4): each change is one statement that also wakes
the runs waiting on the budget it changes, whose messages are then published (a publish that
fails is taken up by the sweeper: Postgres is the outbox). What a budget is, and the words a
run waiting on one is shown in: runtime/flow/budgets.py; the SQL: store/budgets.py."""

from __future__ import annotations

from collections.abc import Sequence
from decimal import Decimal
from typing import Any

import sqlalchemy as sa

from runtime.base.changes import RunChanges
from runtime.base.refused import BadRequest
from runtime.core.enqueue import publish_quietly
from runtime.flow import budgets
from runtime.services import Publisher
from store import budgets as store
from store.rows import RunNotFound
from store.scope import Scope


def _amounts(tokens: Any, usd: Any, what: str) -> tuple[int | None, Decimal | None]:
    """The amounts given (BadRequest naming the field; at least one of them)."""
    if tokens is None and usd is None:
        raise BadRequest(f"{what} names neither tokens nor usd; nothing was stored")
    return (
        None if tokens is None else budgets.tokens_of(tokens, "tokens"),
        None if usd is None else budgets.usd_of(usd, "usd"),
    )


def raise_run_budget(
    engine: sa.Engine,
    changes: RunChanges,
    publisher: Publisher,
    run_id: str,
    *,
    tokens: Any = None,
    usd: Any = None,
    scope: Scope | None = None,
) -> bool:
    """Set run `run_id`'s budget to `tokens` and/or `usd` (what it may spend in all, its spend
    so far included) and, when it waits on its budget, wake it; True when it was woken.
    RunNotFound when no run of that id is in `scope`."""
    amounts = _amounts(tokens, usd, "a budget raise")
    with engine.begin() as conn:
        found, woke = store.raise_run(conn, run_id, *amounts, scope=scope)
    if not found:
        raise RunNotFound(run_id)
    if woke is None:
        changes.announce(run_id)
        return False
    publish_quietly(changes, publisher, run_id, woke)
    return True


def set_budget(
    engine: sa.Engine,
    changes: RunChanges,
    publisher: Publisher,
    scope: str,
    name: str,
    period: str,
    *,
    tokens: Any = None,
    usd: Any = None,
    lift: Sequence[str] = (),
) -> list[str]:
    """Set what agent or tenant `name`'s runs may spend a `period` (day, month; UTC), leaving
    the period's spend as it is, and wake its runs waiting on it; the runs woken. An amount
    not given is kept as it was; one named in `lift` ("tokens", "usd") is removed."""
    if scope not in budgets.SCOPES:
        raise BadRequest(f"scope {scope!r} must be agent or tenant; nothing was stored")
    if period not in budgets.PERIODS:
        raise BadRequest(f"period {period!r} must be day or month; nothing was stored")
    if not name.strip() or len(name) > 200:
        raise BadRequest(f"the {scope}'s name must be 1-200 characters; nothing was stored")
    keep = _kept(tokens, usd, lift)
    amounts = (None, None) if tokens is None and usd is None else _amounts(tokens, usd, "a budget")
    with engine.begin() as conn:
        woken = store.set_budget(conn, scope, name, period, *amounts, keep=keep)
    for run_id, attempt in woken:
        publish_quietly(changes, publisher, run_id, attempt)
    return [run_id for run_id, _ in woken]


def _kept(tokens: Any, usd: Any, lift: Sequence[str]) -> frozenset[str]:
    """The amounts a budget's change leaves as they are: those neither given nor lifted."""
    lifted = set(lift)
    if not lifted <= {"tokens", "usd"}:
        raise BadRequest(f"lift {sorted(lifted)!r}: name tokens and/or usd; nothing was stored")
    given = {name for name, value in (("tokens", tokens), ("usd", usd)) if value is not None}
    if given & lifted:
        raise BadRequest(
            f"{', '.join(sorted(given & lifted))} both set and lifted; choose one (nothing was "
            "stored)"
        )
    if not given | lifted:
        raise BadRequest("a budget names neither tokens nor usd; nothing was stored")
    return frozenset({"tokens", "usd"} - given - lifted)


def list_budgets(engine: sa.Engine) -> list[store.BudgetRow]:
    """Every agent's and tenant's budget, with its period's spend."""
    with engine.connect() as conn:
        return store.list_budgets(conn)
