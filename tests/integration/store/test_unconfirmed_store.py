"""Unconfirmed usage recorded by the claim of a loss itself (store/ledger.py), or by a store
fault's give-back (store/store_faults.py): a lost attempt's note counts only for a step it never
wrote, only in the statement that wins, once; kept apart from the exact usage of written steps in
the run's view."""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal

import pytest

from store.checkpoints import write_checkpoint
from store.losses import claim_lost_many, claim_store_faulted_many
from store.retention import Keeps, delete_expired_runs
from store.rows import FencedOut
from store.runs import claim_delivery, get_run_used, store_answer
from store.store_faults import hand_back_store_fault
from store.usage import StepUsage
from tests.support.stored_runs import stored_run


@dataclass(frozen=True)
class _Note:
    run_id: str
    attempt: int
    step: int
    input_tokens: int = 500
    output_tokens: int = 64
    model: str | None = "m-1"
    cost_usd: Decimal | None = Decimal("0.25")


def _claimed_run(stack) -> str:
    """A run taken by its first attempt (never published)."""
    return stored_run(stack, claimed=True)


def _recorded(stack, run_id: str) -> list[tuple[int, int, int, int]]:
    rows = stack.rows(
        "SELECT attempt, step, input_tokens, output_tokens FROM usage_unconfirmed "
        "WHERE run_id = :r ORDER BY attempt, step",
        r=run_id,
    )
    return [tuple(r) for r in rows]


def test_a_claim_records_the_note_of_a_step_its_attempt_never_wrote(stack) -> None:
    run_id = _claimed_run(stack)
    with stack.db() as conn:
        write_checkpoint(conn, run_id, 1, 1, b"s1", StepUsage(100, 10, 0, "m-1", Decimal("1")))
        # The attempt asked step 2 and died: its note is recorded by the claim that wins.
        claims = claim_lost_many(conn, [(run_id, 1)], 3, notes=[_Note(run_id, 1, 2)])
        assert [c.attempt for c in claims] == [2]
        # A second claim of the same loss wins nothing and records nothing.
        assert claim_lost_many(conn, [(run_id, 1)], 3, notes=[_Note(run_id, 1, 2, 9999)]) == []
        _, used = get_run_used(conn, run_id)
    assert _recorded(stack, run_id) == [(1, 2, 500, 64)]
    # Apart from the exact usage: the written step's tokens are not touched.
    assert (used.input_tokens, used.output_tokens, used.cost_usd) == (100, 10, Decimal(1))
    assert (used.unconfirmed_input_tokens, used.unconfirmed_output_tokens) == (500, 64)
    assert used.unconfirmed_cost_usd == Decimal("0.25")


def test_a_written_step_or_a_stored_answer_records_nothing(stack) -> None:
    written, answered = _claimed_run(stack), _claimed_run(stack)
    with stack.db() as conn:
        # Its note names step 1, which it wrote before it died (in its calls).
        write_checkpoint(conn, written, 1, 1, b"s1", StepUsage(100, 10, 0, "m-1"))
        # Its answer's step was written with the answer, then its hand-on was lost.
        store_answer(conn, answered, 1, b"a", StepUsage(30, 3, 0, "m-1"))
        # A note of another attempt than the one claimed is not this loss's.
        notes = [_Note(written, 1, 1), _Note(answered, 1, 1), _Note(written, 7, 9)]
        claims = claim_lost_many(conn, [(written, 1), (answered, 1)], 3, notes=notes)
        assert len(claims) == 2
    assert _recorded(stack, written) == [] and _recorded(stack, answered) == []


def test_each_loss_records_its_own_attempt_and_a_store_fault_too(stack) -> None:
    run_id = _claimed_run(stack)
    with stack.db() as conn:
        claim_lost_many(conn, [(run_id, 1)], 3, notes=[_Note(run_id, 1, 1)])
        assert claim_delivery(conn, run_id, 2, "test") is not None
        # The second attempt asked the same step again and was lost too: a second billed
        # request, a second record (its own attempt).
        faulted = claim_store_faulted_many(
            conn, [(run_id, 2)], ["test"], notes=[_Note(run_id, 2, 1, 40, 8, None, None)]
        )
        assert [c.attempt for c in faulted] == [3]
        _, used = get_run_used(conn, run_id)
    assert _recorded(stack, run_id) == [(1, 1, 500, 64), (2, 1, 40, 8)]
    # The unpriced one (no model named) counts its tokens, and is counted unpriced.
    assert (used.unconfirmed_input_tokens, used.unpriced) == (540, 1)


def test_a_store_faults_give_back_records_only_a_step_the_run_has_not_written(stack) -> None:
    unwritten, written, answered = _claimed_run(stack), _claimed_run(stack), _claimed_run(stack)
    with stack.db() as conn:
        write_checkpoint(conn, unwritten, 1, 1, b"s1", StepUsage(100, 10, 0, "m-1"))
        # The write of step 1 landed before the fault took its acknowledgement.
        write_checkpoint(conn, written, 1, 1, b"s1", StepUsage(100, 10, 0, "m-1"))
        store_answer(conn, answered, 1, b"a", StepUsage(30, 3, 0, "m-1"))
        # Step 1's held answer (written: nothing) and step 2's note: recorded, of attempt 1.
        spent = [_Note(unwritten, 1, 1, 7, 3), _Note(unwritten, 1, 2, 40, 8)]
        assert hand_back_store_fault(conn, unwritten, 1, "w", "OperationalError", spent) == 2
        assert hand_back_store_fault(conn, written, 1, "w", "E", [_Note(written, 1, 1)]) == 2
        assert hand_back_store_fault(conn, answered, 1, "w", "E", [_Note(answered, 1, 1)]) == 2
        # A second give-back of the same attempt matches nothing and records nothing (I3, I4).
        with pytest.raises(FencedOut):
            hand_back_store_fault(conn, unwritten, 1, "w", "E", [_Note(unwritten, 1, 3)])
        _, used = get_run_used(conn, unwritten)
    assert _recorded(stack, unwritten) == [(1, 2, 40, 8)]
    assert _recorded(stack, written) == [] and _recorded(stack, answered) == []
    assert (used.input_tokens, used.unconfirmed_input_tokens) == (100, 40)


def test_retention_deletes_a_runs_unconfirmed_usage_with_it(stack) -> None:
    run_id = _claimed_run(stack)
    with stack.db() as conn:
        claim_lost_many(conn, [(run_id, 1)], 0, notes=[_Note(run_id, 1, 1)])  # failed at once
        conn.exec_driver_sql(
            "UPDATE runs SET finished_at = now() - interval '2 days' "
            "WHERE id = CAST(%(r)s AS uuid)",
            {"r": run_id},
        )
        assert _recorded(stack, run_id) == [(1, 1, 500, 64)]
        gone = delete_expired_runs(conn, Keeps(86400, 86400, 86400, 86400), batch=10)
    assert gone.deleted == 1 and _recorded(stack, run_id) == []
