"""A run lost more than twice is failed with the reason on its transcript."""

from __future__ import annotations

import pytest

from tests.support.scripts import mixed


@pytest.mark.kill
def test_run_lost_three_times_is_failed_with_the_reason(stack) -> None:
    stack.worker("ops", runs=False)  # sweeps only: every run-taking worker dies
    stack.beat()
    run_id = stack.start(mixed("l"))
    for n in range(3):
        victim = stack.worker(f"victim{n}", fault="after_claim:kill", ops=False)
        stack.fault_hit(f"victim{n}")
        victim.popen.wait(timeout=10)
    view = stack.wait(run_id, timeout=60)
    assert view.status == "failed"
    assert view.lost_count == 3
    assert "lost 3 times" in view.failure_reason
    role, text = stack.client.transcript(run_id)[-1]
    assert role == "notice" and "lost 3 times" in text
    kinds = [
        r.kind
        for r in stack.rows("SELECT kind FROM audit_events WHERE run_id = :r ORDER BY id", r=run_id)
    ]
    assert kinds.count("agent.run.lost") == 2 and kinds[-1] == "agent.run.failed"
