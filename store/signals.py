"""Signals: messages sent to a run, each taken once (a workflow's `wait_signal`, an agent's
next step boundary).

A signal is one row, inserted and its waiting run woken in one statement; a sender's key makes
a send idempotent (the same key sends nothing more). A step takes the oldest signal of its name
with one conditional update naming the step's identity, fenced on the attempt (I3): a resume
that lost the taken signal before recording it takes the same one again, never a second.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa

from store.db import sql, to_json
from store.rows import Attempt, FencedOut
from store.runs import OWNER_CTE
from store.scope import Scope

# An agent run's signals are taken as `agent:<step>`: by its boundary after that step.
AGENT_TAKER = "agent"


@dataclass(frozen=True)
class Sent:
    """What a send did: the signal's id, whether this send stored it (False: its key had sent
    it before), the run's status, and the attempt of a run it woke (None: it was not waiting
    for it)."""

    signal_id: int | None
    new: bool
    run_status: str | None
    woke: Attempt | None


def send_signal(
    conn: sa.Connection,
    *,
    run_id: str,
    name: str,
    payload: Any,
    key: str,
    by: str,
    scope: Scope | None = None,
) -> Sent:
    """Store the signal for a run that has not ended and wake the run if it waits for a
    signal of this name, in one statement (audited `agent.signal.sent`); a key that sent one
    before answers that signal, whether the run has ended since or not. A run out of `scope`
    reads as missing (status None)."""
    seen = "true" if scope is None else scope.sees("runs")
    row = conn.execute(
        sql(
            f"""
            WITH r AS (
                SELECT id, status FROM runs
                WHERE id = CAST(:run_id AS uuid) AND {seen} FOR UPDATE),
            -- A key sent before (committed, or committing at once: its row is waited for)
            -- comes back as it was, not new; the update changes nothing of it.
            put AS (
                INSERT INTO signals (run_id, name, payload, key, sent_by)
                SELECT id, :name, CAST(:payload AS jsonb), :key, :by FROM r
                WHERE r.status NOT IN ('succeeded', 'failed')
                ON CONFLICT (run_id, key) DO UPDATE SET key = EXCLUDED.key
                RETURNING id, (xmax = 0) AS created),
            ins AS (SELECT id FROM put WHERE created),
            -- The same key sent again after its run ended: the signal it sent, not a refusal.
            old AS (
                SELECT id FROM signals
                WHERE run_id = CAST(:run_id AS uuid) AND key = :key
                  AND NOT EXISTS (SELECT 1 FROM put)),
            w AS (
                UPDATE runs SET status = 'queued', attempt = attempt + 1, deliveries = 0,
                       resume_reason = 'wait_over', waiting_on = NULL, queued_at = now(),
                       updated_at = now()
                WHERE id IN (SELECT id FROM r) AND status = 'waiting'
                  AND split_part(waiting_on, ':', 1) = 'signal'
                  AND split_part(waiting_on, ':', 2) = :name
                  AND EXISTS (SELECT 1 FROM ins)
                RETURNING attempt),
            a AS (
                INSERT INTO audit_events (run_id, kind, detail)
                SELECT CAST(:run_id AS uuid), 'agent.signal.sent',
                       jsonb_build_object('signal_id', ins.id, 'name', CAST(:name AS text),
                                          'by', CAST(:by AS text))
                FROM ins)
            SELECT (SELECT status FROM r) AS status,
                   coalesce((SELECT id FROM put), (SELECT id FROM old)) AS signal_id,
                   EXISTS (SELECT 1 FROM ins) AS created, (SELECT attempt FROM w) AS woke
            """
        ),
        {
            **(scope.params() if scope is not None else {}),
            "run_id": run_id,
            "name": name,
            "payload": to_json(payload),
            "key": key,
            "by": by,
        },
    ).one()
    woke = None if row.woke is None else Attempt(row.woke)
    return Sent(row.signal_id, bool(row.created), row.status, woke)


def take_signal(
    conn: sa.Connection, run_id: str, attempt: int, name: str, identity: str
) -> tuple[bool, Any]:
    """Take the oldest signal of `name` for the step `identity` of this attempt's run (fenced,
    I3), or the one this identity took before (a resume): (taken, its payload)."""
    row = conn.execute(
        sql(
            f"""
            WITH {OWNER_CTE},
            pick AS (
                SELECT s.id FROM signals s, owner
                WHERE s.run_id = owner.id AND s.name = :name
                  AND (s.taken_by IS NULL OR s.taken_by = :identity)
                ORDER BY (s.taken_by IS NULL), s.id LIMIT 1
                FOR UPDATE OF s)
            UPDATE signals SET taken_by = :identity, taken_at = coalesce(taken_at, now())
            WHERE id IN (SELECT id FROM pick)
            RETURNING payload
            """
        ),
        {"run_id": run_id, "attempt": attempt, "name": name, "identity": identity},
    ).first()
    if row is None:
        owned = conn.execute(
            sql(f"WITH {OWNER_CTE} SELECT count(*) FROM owner"),
            {"run_id": run_id, "attempt": attempt},
        ).scalar_one()
        if not owned:
            raise FencedOut(run_id, attempt, f"take signal {name}")
        return False, None
    return True, row.payload


def take_agent_signals(
    conn: sa.Connection, run_id: str, attempt: int, step: int
) -> list[dict[str, Any]]:
    """Take every signal an agent run's next step (after `step`) is told, oldest first, fenced
    (I3): those not taken yet, and those an attempt took at this same step but never wrote
    the next one after (a resume tells them again, so each reaches the record once)."""
    rows = conn.execute(
        sql(
            f"""
            WITH {OWNER_CTE}
            UPDATE signals SET taken_by = :taker, taken_at = coalesce(taken_at, now())
            WHERE run_id IN (SELECT id FROM owner)
              AND (taken_by IS NULL OR taken_by = :taker)
            RETURNING id, name, payload
            """
        ),
        {"run_id": run_id, "attempt": attempt, "taker": f"{AGENT_TAKER}:{step}"},
    ).all()
    return [{"id": r.id, "name": r.name, "payload": r.payload} for r in sorted(rows)]
