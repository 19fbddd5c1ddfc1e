"""Step records form a chain (I6): a record dropped, two reordered, one moved from another run,
or an older one replayed in place of a newer fails the resumed run `seal_failed`, audited, and
nothing of the tampered step is made.

Each test kills a real worker right after its second step record is written (the first step's
read and keyed write made, the second step's comment not yet), tampers the rows in Postgres,
then a survivor and beat resume the run; everything is judged from Postgres and the vendor
simulator's own records.
"""

from __future__ import annotations

import pytest

from runtime.durable import chain
from store.checkpoints import select_step_records
from store.runs import get_run
from tests.support.scripts import mixed

KILL_AT_SECOND_RECORD = "after_checkpoint:kill:2"

TAMPER = {
    # The first record removed: the chain now starts at step 2.
    "drop_first": "DELETE FROM run_steps WHERE run_id = :r AND step = 1",
    # The latest record removed: the chain stops short of the run's step.
    "drop_latest": "DELETE FROM run_steps WHERE run_id = :r AND step = 2",
    # Two records' contents swapped: each sits at the other's place.
    "reorder": """
        UPDATE run_steps s SET sealed = o.sealed
        FROM run_steps o
        WHERE s.run_id = :r AND o.run_id = :r AND o.step = 3 - s.step AND s.step IN (1, 2)
    """,
    # An older record of the run replayed in place of the newer one.
    "replay_older": """
        UPDATE run_steps SET sealed = (SELECT sealed FROM run_steps WHERE run_id = :r AND step = 1)
        WHERE run_id = :r AND step = 2
    """,
    # The record of the same step of another run.
    "from_other_run": """
        UPDATE run_steps SET sealed = (SELECT sealed FROM run_steps WHERE run_id = :o AND step = 2)
        WHERE run_id = :r AND step = 2
    """,
}


@pytest.mark.kill
@pytest.mark.parametrize("tamper", sorted(TAMPER))
def test_tampered_chain_fails_the_resumed_run(stack, tamper: str) -> None:
    other = None
    if tamper == "from_other_run":
        helper = stack.worker("helper")
        other = stack.start(mixed("o"))
        assert stack.wait(other).status == "succeeded"
        helper.stop()
    run_id = stack.kill_at(KILL_AT_SECOND_RECORD, lambda: stack.start(mixed("t")))
    assert [r.step for r in stack.rows("SELECT step FROM run_steps WHERE run_id = :r", r=run_id)]
    (run,) = stack.rows("SELECT step FROM runs WHERE id = :r", r=run_id)
    assert run.step == 2
    writes_before = stack.vendor_writes(run_id)
    asked_before = stack.asked(run_id)
    stack.rows(TAMPER[tamper] + " RETURNING 1", r=run_id, o=other)

    stack.worker("survivor")
    stack.beat()
    view = stack.wait(run_id, timeout=60)

    assert view.status == "failed", view
    assert "does not verify" in view.failure_reason
    audit = stack.rows(
        "SELECT detail FROM audit_events WHERE run_id = :r AND kind = 'agent.run.failed'", r=run_id
    )
    assert [a.detail["code"] for a in audit] == ["seal_failed"]
    assert stack.client.transcript(run_id)[-1][0] == "notice"
    # Nothing the tampered chain asked was made, and the model was not asked the next step.
    assert stack.vendor_writes(run_id) == writes_before
    assert stack.asked(run_id) == asked_before


@pytest.mark.kill
def test_intact_chain_resumes_and_finishes(stack) -> None:
    """The control: the same kill with the chain untouched resumes from step 2 and finishes,
    each write made once."""
    run_id = stack.kill_at(KILL_AT_SECOND_RECORD, lambda: stack.start(mixed("c")))
    stack.worker("survivor")
    stack.beat()
    view = stack.wait(run_id, timeout=60)
    assert view.status == "succeeded", view
    assert stack.asked(run_id) == {1: 1, 2: 1, 3: 1, 4: 1}
    steps = stack.rows("SELECT step FROM run_steps WHERE run_id = :r ORDER BY step", r=run_id)
    assert [s.step for s in steps] == [1, 2, 3]


@pytest.mark.kill
def test_run_checkpointed_before_the_upgrade_resumes_from_its_whole_state(stack) -> None:
    """A run in flight during the upgrade has its latest whole state in `runs.checkpoint` (as
    the code before step records sealed it: purpose `checkpoint`, the run's step) and no step
    records: it resumes from that state, and its next steps add records chained to it."""
    run_id = stack.kill_at(KILL_AT_SECOND_RECORD, lambda: stack.start(mixed("u")))
    with stack.db() as conn:
        run = get_run(conn, run_id)
        state = chain.rebuild(stack.sealer, run, select_step_records(conn, run_id))
    whole = stack.sealer.seal(run_id, "checkpoint", state.step, state.to_payload())
    stack.rows(
        "UPDATE runs SET checkpoint = :c WHERE id = :r AND step = 2 RETURNING 1", c=whole, r=run_id
    )
    stack.rows("DELETE FROM run_steps WHERE run_id = :r RETURNING 1", r=run_id)

    stack.worker("survivor")
    stack.beat()
    view = stack.wait(run_id, timeout=60)
    assert view.status == "succeeded", view
    # Step 2's comment was taken up from the whole state; step 3 was asked once and recorded.
    assert stack.asked(run_id) == {1: 1, 2: 1, 3: 1, 4: 1}
    assert [
        s.step for s in stack.rows("SELECT step FROM run_steps WHERE run_id = :r", r=run_id)
    ] == [3]
    assert stack.posts_by_vendor(run_id) == {"incidents": 1, "issues": 1, "chat": 1}
