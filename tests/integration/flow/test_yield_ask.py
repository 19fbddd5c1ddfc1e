"""A loss's claim asks one running first attempt, the youngest, to yield its slot to the lost
run; the ask reaches that run with the gates its checkpoint reads, only while the lost run is
still queued; its hand-back clears it, and a resumed run is never asked (no ping-pong)."""

from __future__ import annotations

from bench.bulk import insert_running_runs
from store.checkpoints import write_checkpoint
from store.gates import select_gates
from store.losses import ASKS_PER_CLAIM, claim_lost_many
from store.runs import claim_delivery, get_run, hand_back
from store.states import ResumeReason


def _running(stack, n: int = 1) -> list[str]:
    """`n` running first attempts, each claimed after the one before (youngest last)."""
    ids: list[str] = []
    for _ in range(n):
        with stack.engine.begin() as conn:
            ids += insert_running_runs(conn, 1, holder="busy")
    return ids


def _lose(stack, run_id: str, attempt: int = 1, ask: bool = True) -> None:
    with stack.engine.begin() as conn:
        [claim] = claim_lost_many(conn, [(run_id, attempt)], loss_limit=3, ask_yields=ask)
    assert claim.status == "queued"


def _asked_of(stack, run_id: str) -> str | None:
    rows = stack.rows(
        "SELECT detail ->> 'asked_to_yield' AS y FROM audit_events "
        "WHERE run_id = :r AND kind = 'agent.run.lost' ORDER BY id DESC LIMIT 1",
        r=run_id,
    )
    return rows[0].y


def test_a_loss_asks_the_youngest_first_attempt_while_the_lost_run_waits(stack) -> None:
    older, younger = _running(stack, 2)
    [lost] = _running(stack)  # claimed last, but it is the one lost: never asked itself
    _lose(stack, lost)
    assert _asked_of(stack, lost) == younger
    with stack.engine.begin() as conn:
        assert select_gates(conn, older).yield_to is None
        # The step's own checkpoint statement carries the ask: no round trip of its own.
        assert write_checkpoint(conn, younger, 1, 1, b"step-1").yield_to == lost
        # A free slot took the lost run: nobody has to yield any more.
        assert claim_delivery(conn, lost, 2, "free-slot") is not None
        assert write_checkpoint(conn, younger, 1, 2, b"step-2").yield_to is None


def test_a_yield_clears_the_ask_and_a_resumed_run_is_never_asked(stack) -> None:
    first, second = _running(stack, 2)  # to be lost, older than both below
    older, younger = _running(stack, 2)
    _lose(stack, first)
    assert _asked_of(stack, first) == younger
    with stack.engine.begin() as conn:
        assert hand_back(conn, younger, 1, "w1", ResumeReason.YIELDED, yielded_to=first) == 2
        row = get_run(conn, younger)
        assert (row.yield_for, row.resume_reason, row.status) == (None, "yielded", "queued")
    detail = stack.rows(
        "SELECT detail FROM audit_events WHERE run_id = :r AND kind = 'agent.run.handed_back'",
        r=younger,
    )[0].detail
    assert (detail["reason"], detail["yielded_to"]) == ("yielded", first)
    # The yielded run is resumed now (attempt 2): the next loss asks the other first attempt.
    with stack.engine.begin() as conn:
        assert claim_delivery(conn, younger, 2, "w2") is not None
    _lose(stack, second)
    assert _asked_of(stack, second) == older
    with stack.engine.begin() as conn:
        assert select_gates(conn, younger).yield_to is None


def test_with_the_order_off_no_run_is_asked(stack) -> None:
    [busy] = _running(stack)
    [lost] = _running(stack)
    _lose(stack, lost, ask=False)
    assert _asked_of(stack, lost) is None
    with stack.engine.begin() as conn:
        assert get_run(conn, busy).yield_for is None


def test_an_asked_run_yields_to_any_lost_run_still_queued(stack) -> None:
    # The broker serves lost runs in the order they were published, not in the order of the
    # asks: the slot another yield freed may take the run this one was asked for. While any
    # lost run waits, an asked run still yields; once none does, nobody yields.
    lost_a, lost_b = _running(stack, 2)
    _running(stack, 2)
    _lose(stack, lost_a)
    _lose(stack, lost_b)
    asked_for_a = _asked_of(stack, lost_a)
    with stack.engine.begin() as conn:
        assert claim_delivery(conn, lost_a, 2, "slot-freed-by-another-yield") is not None
        assert select_gates(conn, asked_for_a).yield_to == lost_b
        assert claim_delivery(conn, lost_b, 2, "another-slot") is not None
        assert select_gates(conn, asked_for_a).yield_to is None


def test_an_ask_that_fell_on_a_run_lost_since_is_passed_on(stack) -> None:
    # A dead process's pool children are claimed one holder at a time: the first claim may
    # ask the youngest run, which is another of the dead process's runs. Its own claim passes
    # the ask on to a run that lives.
    [alive] = _running(stack)
    lost, dead_too = _running(stack, 2)
    _lose(stack, lost)
    assert _asked_of(stack, lost) == dead_too
    _lose(stack, dead_too)
    with stack.engine.begin() as conn:
        assert get_run(conn, dead_too).yield_for is None
        assert get_run(conn, alive).yield_for in (lost, dead_too)
        assert select_gates(conn, alive).yield_to in (lost, dead_too)


def test_a_mass_loss_asks_no_more_runs_than_one_claim_may(stack) -> None:
    """A claim of many lost runs asks at most `ASKS_PER_CLAIM` running runs to yield: a mass
    loss needs a handful of slots at once, and locking a yielder per lost run made a sweep of
    1,000 lapsed runs take seconds."""
    lost = _running(stack, ASKS_PER_CLAIM + 8)
    busy = _running(stack, ASKS_PER_CLAIM + 8)
    with stack.engine.begin() as conn:
        claims = claim_lost_many(conn, [(r, 1) for r in lost], loss_limit=3, ask_yields=True)
    assert len(claims) == len(lost)
    asked = stack.rows("SELECT id FROM runs WHERE yield_for IS NOT NULL")
    assert len(asked) == ASKS_PER_CLAIM
    assert {str(r.id) for r in asked} <= set(busy)
