"""A run on a real worker, judged from Postgres and the vendor's records."""

from __future__ import annotations

from tests.support.scripts import mixed


def test_run_succeeds_on_a_real_worker(stack) -> None:
    stack.worker("w1")
    run_id = stack.start(mixed("a"))
    view = stack.wait(run_id, timeout=60)
    assert view.status == "succeeded", view
    assert view.answer == "Handled a."
    assert stack.client.transcript(run_id) == [("user", "help"), ("assistant", "Handled a.")]
    writes = stack.vendor_writes(run_id)
    assert [w.vendor for w in writes] == ["incidents", "issues", "chat"]
    assert all(w.attempt == 1 and w.status == 201 for w in writes)
    assert stack.asked(run_id) == {1: 1, 2: 1, 3: 1, 4: 1}
    # A read-heavy step costs one write: reads are never marked.
    marks = stack.rows("SELECT tool FROM call_marks WHERE run_id = :r ORDER BY step", r=run_id)
    assert [m.tool for m in marks] == ["incident.create", "issue.comment", "chat.reply"]
