"""The budgets' statements on their own (store/budgets.py): a reservation is all or none across
an agent's and a tenant's budgets, a period that turns starts from nothing, and a settlement
lands only in the budget rows and periods its reservation was made in."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import sqlalchemy as sa

from store.budgets import Exhausted, Reservation, list_budgets, reserve, set_budget, settle

D0 = Decimal(0)


def _spent(stack) -> dict[tuple[str, str], int]:
    with stack.db() as conn:
        return {(b.scope, b.period): b.spent_tokens for b in list_budgets(conn)}


def test_a_reservation_is_all_or_none_and_settles_to_usage(stack) -> None:
    with stack.db() as conn:
        assert reserve(conn, "a", "t", 10, D0) is None  # no budget applies: nothing to reserve
        set_budget(conn, "agent", "a", "day", 100, None)
        set_budget(conn, "tenant", "t", "month", 50, None)
        held = reserve(conn, "a", "t", 40, D0)
        assert isinstance(held, Reservation)
        # The tenant's month has 10 left: the agent's day (60 left) is not charged either.
        short = reserve(conn, "a", "t", 20, D0)
        assert isinstance(short, Exhausted) and (short.scope, short.name) == ("tenant", "t")
    assert _spent(stack) == {("agent", "day"): 40, ("tenant", "month"): 40}
    with stack.db() as conn:
        settle(conn, held, 25, D0)  # the response used 25 of its 40
    assert _spent(stack) == {("agent", "day"): 25, ("tenant", "month"): 25}
    with stack.db() as conn:
        # Another agent's run under the same tenant spends the tenant's month alone.
        assert isinstance(reserve(conn, "b", "t", 25, D0), Reservation)
        assert isinstance(reserve(conn, "b", "t", 1, D0), Exhausted)
    assert _spent(stack) == {("agent", "day"): 25, ("tenant", "month"): 50}


def test_a_turned_period_starts_from_nothing_and_keeps_an_old_reservation(stack) -> None:
    with stack.db() as conn:
        set_budget(conn, "agent", "a", "day", 100, Decimal("1"))
        held = reserve(conn, "a", "t", 90, Decimal("0.5"))
        assert isinstance(held, Reservation)
        # The day turns: that reservation, and the spend holding it, were yesterday's.
        conn.exec_driver_sql("UPDATE budgets SET period_start = period_start - interval '1 day'")
        held = replace(held, at=held.at - timedelta(days=1))
        fresh = reserve(conn, "a", "t", 90, Decimal("0.5"))
        assert isinstance(fresh, Reservation)
        # Yesterday's reservation settled now lands nowhere: today's spend is today's alone.
        settle(conn, held, 5, D0)
        (row,) = list_budgets(conn)
    assert (row.spent_tokens, row.spent_usd) == (90, Decimal("0.5"))


def test_a_settlement_leaves_a_budget_set_after_its_reservation_alone(stack) -> None:
    """X reserves against its agent's budget alone; the operator then sets a tenant budget and
    Y reserves on it; X settling takes its reservation off the agent's budget only, never off
    the new row (which would erase Y's hold)."""
    with stack.db() as conn:
        set_budget(conn, "agent", "a", "day", 10_000, None)
        x = reserve(conn, "a", "t", 4000, D0)
        assert isinstance(x, Reservation) and x.keys == (("agent", "a", "day"),)
        set_budget(conn, "tenant", "t", "month", 100_000, None)
        y = reserve(conn, "b", "t", 5000, D0)  # another agent's run, under the tenant alone
        assert isinstance(y, Reservation) and y.keys == (("tenant", "t", "month"),)
        settle(conn, x, 100, D0)  # X's response used 100 of its 4000
    assert _spent(stack) == {("agent", "day"): 100, ("tenant", "month"): 5000}


def test_a_periods_end_is_in_utc_whatever_the_sessions_time_zone(stack) -> None:
    """A day or a month ends at UTC midnight, on a server whose time zone is another (an
    interval added to a timestamptz counts in the session's zone: hours off, and a wait that
    named that end would be woken again and again until the true one)."""
    with stack.engine.connect() as conn:
        conn.execute(sa.text("SET TimeZone = 'America/New_York'"))  # the session's, not UTC
        try:
            set_budget(conn, "agent", "a", "month", 1, None)
            set_budget(conn, "tenant", "t", "day", 1, None)
            found = reserve(conn, "a", "t", 5, None)
            ends = {(b.scope, b.period): b.ends for b in list_budgets(conn)}
            now = conn.execute(sa.text("SELECT now() AT TIME ZONE 'UTC' AS n")).scalar_one()
            zone = conn.execute(sa.text("SELECT current_setting('TimeZone')")).scalar_one()
        finally:
            conn.execute(sa.text("RESET TimeZone"))
            conn.commit()
    assert zone == "America/New_York"
    tomorrow = datetime(now.year, now.month, now.day, tzinfo=UTC) + timedelta(days=1)
    month = now.month % 12 + 1
    next_month = datetime(now.year + (now.month == 12), month, 1, tzinfo=UTC)
    assert ends == {("agent", "month"): next_month, ("tenant", "day"): tomorrow}
    assert isinstance(found, Exhausted) and found.ends in (next_month, tomorrow)
