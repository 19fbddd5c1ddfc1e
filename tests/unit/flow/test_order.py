"""Resumed runs first: the priority each attempt is published with (runtime/flow/order.py)."""

from __future__ import annotations

from runtime.base.tenancy import HIGH, LOW, NORMAL
from runtime.flow.order import FIRST_BY_PRIORITY, NEW, PRIORITY_STEPS, RESUMED, priority


def test_a_first_attempt_goes_behind_every_resumed_one() -> None:
    assert priority(1) == NEW
    assert [priority(n) for n in (2, 3, 7)] == [RESUMED] * 3
    # kombu's Redis transport serves bucket 0 first; both are buckets of its own steps, so the
    # broker keeps them apart instead of folding one into the other.
    assert RESUMED == PRIORITY_STEPS[0] < NEW
    assert {RESUMED, NEW} <= set(PRIORITY_STEPS)


def test_the_order_off_names_no_priority() -> None:
    # LIYAGENT_RESUMED_FIRST=false: every message in the broker's default bucket, one FIFO.
    assert priority(1, resumed_first=False) is None
    assert priority(5, resumed_first=False) is None


def test_an_impossible_attempt_is_still_published_as_new() -> None:
    # A message is a hint: one naming no real attempt goes behind the resumed ones, and its
    # claim drops it.
    assert priority(0) == NEW


def test_a_first_attempt_goes_to_its_priority_bucket_and_a_resumed_one_before_all() -> None:
    assert [priority(1, run_priority=p) for p in (HIGH, NORMAL, LOW)] == [3, NEW, 9]
    assert priority(2, run_priority=LOW) == RESUMED
    assert all(b in PRIORITY_STEPS for b in FIRST_BY_PRIORITY.values())
    # The order off: one FIFO, priorities too (held runs are still admitted by priority).
    assert priority(1, resumed_first=False, run_priority=HIGH) is None
