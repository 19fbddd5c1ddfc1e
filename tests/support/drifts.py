"""What the deploy tests wait for and read of a run's definition drifts (runtime/core/drift.py):
a bounded poll, and the run's `agent.run.definition_drift` audits in order."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any


def until(check: Callable[[], bool], what: str, timeout: float = 30) -> None:
    """Poll `check` every 0.1 s until it holds; fail naming `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, what
        time.sleep(0.1)


def drift_audits(stack: Any, run_id: str) -> list[dict[str, Any]]:
    """The details of the run's definition-drift audits, oldest first."""
    rows = stack.rows(
        "SELECT detail FROM audit_events WHERE run_id = :r "
        "AND kind = 'agent.run.definition_drift' ORDER BY id",
        r=run_id,
    )
    return [r.detail for r in rows]
