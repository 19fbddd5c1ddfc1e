"""Warm shutdown (SIGTERM) hands a run back at its next step; it continues elsewhere at once."""

from __future__ import annotations

import signal
import time

import pytest

from tests.support.scripts import mixed


@pytest.mark.kill
def test_sigterm_hands_runs_back_without_a_loss(stack) -> None:
    victim = stack.worker("victim")
    run_id = stack.start(mixed("h", latency_ms=1500))  # steps long enough to signal within one
    deadline = time.monotonic() + 30
    while stack.client.get(run_id).step < 1:
        assert time.monotonic() < deadline, "the run never reached its first checkpoint"
        time.sleep(0.05)
    # To the main process only, as `docker stop` does, at once (a survivor started first could
    # take seconds on a loaded machine, time enough for the run to end where it is); the run
    # handed back waits in the queue for the survivor.
    victim.popen.send_signal(signal.SIGTERM)
    stack.worker("survivor")

    view = stack.wait(run_id, timeout=60)
    assert view.status == "succeeded"
    # Handed back, not lost: no lease had to lapse, no loss was counted.
    assert view.lost_count == 0 and view.attempt == 2
    kinds = [
        r.kind
        for r in stack.rows("SELECT kind FROM audit_events WHERE run_id = :r ORDER BY id", r=run_id)
    ]
    assert kinds == ["agent.run.handed_back", "agent.run.resumed"]
    victim.popen.wait(timeout=30)
    assert victim.popen.returncode == 0, victim.output()[-2000:]
    assert stack.posts_by_vendor(run_id) == {"incidents": 1, "issues": 1, "chat": 1}
    assert stack.asked(run_id) == {1: 1, 2: 1, 3: 1, 4: 1}
