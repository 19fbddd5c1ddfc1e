"""The step ledger's statements on their own (store/usage.py): a step's usage lands with its
record only when the fenced write matches, an answer stored first keeps its step's usage when
it is handed on, and the run's usage sums them (tokens and cost) in the read of its row, with
its children's in `with_children`."""

from __future__ import annotations

from dataclasses import replace
from decimal import Decimal

import pytest

from store.checkpoints import write_checkpoint
from store.entries import deliver
from store.rows import FencedOut
from store.runs import get_run_used, store_answer
from store.usage import StepUsage, UsageTotals
from tests.support.stored_runs import stored_run


def _claimed_run(stack) -> str:
    """A run taken by its first attempt (never published)."""
    return stored_run(stack, claimed=True)


def test_a_step_usage_lands_only_with_its_written_step(stack) -> None:
    run_id = _claimed_run(stack)
    with stack.db() as conn:
        write_checkpoint(conn, run_id, 1, 1, b"s1", StepUsage(100, 10, 40, "m-1", Decimal("0.5")))
        # A stale attempt's write of the next step matches nothing: nothing of it is counted.
        with pytest.raises(FencedOut):
            write_checkpoint(conn, run_id, 0, 2, b"stale", StepUsage(999, 999, 0, "m-1"))
        # The same step written again matches nothing either (a step is written once, I5).
        with pytest.raises(FencedOut):
            write_checkpoint(conn, run_id, 1, 1, b"again", StepUsage(999, 999, 0, "m-1"))
        write_checkpoint(conn, run_id, 1, 2, b"s2", None)  # its provider reported none
        # An unpriced model: its tokens count, its cost is unknown (not 0).
        store_answer(conn, run_id, 1, b"answer", StepUsage(30, 3, 0, "m-2"))
        # Handed on after (an entry point outside Postgres): the answer's usage stays.
        deliver(conn, run_id, 1, "done", retention_s=60)
        row, used = get_run_used(conn, run_id)
        steps = conn.exec_driver_sql(
            "SELECT step, input_tokens, output_tokens, cached_tokens, model, cost_usd "
            "FROM run_steps "
            "WHERE run_id = %(r)s ORDER BY step",
            {"r": run_id},
        ).all()
    assert [tuple(s) for s in steps] == [
        (1, 100, 10, 40, "m-1", Decimal("0.5")),
        (2, None, None, None, None, None),
    ]
    assert (row.answer_input_tokens, row.answer_output_tokens, row.answer_model) == (30, 3, "m-2")
    assert row.status == "succeeded"
    own = UsageTotals(130, 13, 40, cost_usd=Decimal("0.5"), unpriced=1)
    assert used == replace(own, with_children=own)


def test_an_answer_delivered_in_one_statement_carries_its_usage(stack) -> None:
    run_id = _claimed_run(stack)
    with stack.db() as conn:
        deliver(
            conn,
            run_id,
            1,
            "done",
            retention_s=60,
            sealed_answer=b"answer",
            usage=StepUsage(8, 2, 5, "m-3", Decimal("0.000000125")),
        )
        _, used = get_run_used(conn, run_id)
    assert (used.input_tokens, used.output_tokens, used.cached_tokens) == (8, 2, 5)
    assert used.cost_usd == Decimal("0.000000125")
    assert used.to_json()["cost_usd"] == "0.000000125"


def test_a_child_run_rolls_up_to_its_parent(stack) -> None:
    """A delegated run's usage is its own, and its parent's (and grandparent's) `with_children`
    total: counted once at each level, never in the parent's own figures."""
    parent, child, grandchild = _claimed_run(stack), _claimed_run(stack), _claimed_run(stack)
    with stack.db() as conn:
        conn.exec_driver_sql(
            "UPDATE runs SET parent_run_id = CAST(%(p)s AS uuid) WHERE id = CAST(%(c)s AS uuid)",
            {"p": parent, "c": child},
        )
        conn.exec_driver_sql(
            "UPDATE runs SET parent_run_id = CAST(%(p)s AS uuid) WHERE id = CAST(%(c)s AS uuid)",
            {"p": child, "c": grandchild},
        )
        write_checkpoint(conn, parent, 1, 1, b"p", StepUsage(10, 1, 0, "m", Decimal("1")))
        write_checkpoint(conn, child, 1, 1, b"c", StepUsage(20, 2, 0, "m", Decimal("2")))
        write_checkpoint(conn, grandchild, 1, 1, b"g", StepUsage(40, 4, 0, "m", Decimal("4")))
        _, top = get_run_used(conn, parent)
        _, middle = get_run_used(conn, child)
    assert (top.input_tokens, top.cost_usd) == (10, Decimal(1))
    assert top.with_children is not None
    assert (top.with_children.input_tokens, top.with_children.output_tokens) == (70, 7)
    assert top.with_children.cost_usd == Decimal(7)
    assert middle.with_children is not None and middle.with_children.input_tokens == 60
