"""Applying an operator's Stop (the client, the CLI, the front): recorded and every run it covers
ended or handed to its compensation in one statement (store/gates.py `insert_stop`), then the
fleet told: followers nudged, compensations published, leases dropped (their requests cut)."""

from __future__ import annotations

from runtime.core.enqueue import publish_quietly
from runtime.services import Services
from store.gates import insert_stop


def apply_stop(
    s: Services, *, run_id: str | None, agent: str | None, reason: str, by: str
) -> list[str]:
    """Stop one run (with its children and theirs) or an agent's runs; the runs failed now."""
    with s.engine.connect() as conn:
        done = insert_stop(conn, run_id=run_id, agent=agent, reason=reason, by=by)
    for stopped in done.failed:
        s.changes.announce(stopped)
    s.leases.forget_steps(done.failed)
    # Workflows that catch a Stop: their attempt in flight is fenced out and cut like the
    # rest, and lets its lease go; the new one, which raises the Stop in their function, takes
    # it only then (its delivery waits for the older attempt's lease).
    s.leases.cut_attempts([(q.run_id, q.attempt) for q in done.compensating])
    for q in done.compensating:
        publish_quietly(s.changes, s.publisher, q.run_id, q.attempt, q.priority)
    return done.failed
