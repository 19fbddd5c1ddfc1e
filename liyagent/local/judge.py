"""The kill trials' judge, in SQL: every verdict reads Postgres and the vendors' own records
(the simulators' `sim` schema), never the engine's belief about itself. Harness SQL, so it lives
with the trials, not in `store/` (which holds only the engine's)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

import sqlalchemy as sa

from store.db import sql


@dataclass(frozen=True)
class TrialEnd:
    """Where one trial's record stands: its run, whether and when it ended, and how."""

    run_id: str | None
    ended: bool
    failed: bool
    ended_at: datetime | None
    lost_count: int


def webhook_end(conn: sa.Connection, request_key: str) -> TrialEnd:
    row = conn.execute(
        sql("SELECT id, status, finished_at, lost_count FROM runs WHERE request_key = :k"),
        {"k": request_key},
    ).first()
    if row is None:
        return TrialEnd(None, False, False, None, 0)
    return TrialEnd(
        row.id,
        row.status in ("succeeded", "failed"),
        row.status == "failed",
        row.finished_at,
        row.lost_count,
    )


def cron_end(conn: sa.Connection, trigger: str, scheduled_at: datetime) -> TrialEnd:
    row = conn.execute(
        sql(
            "SELECT c.run_id, c.status, c.recorded_at, r.lost_count FROM cron_runs c "
            "JOIN runs r ON r.id = c.run_id WHERE c.trigger = :t AND c.scheduled_at = :at"
        ),
        {"t": trigger, "at": scheduled_at},
    ).first()
    if row is None:
        return TrialEnd(None, False, False, None, 0)
    return TrialEnd(
        row.run_id,
        row.recorded_at is not None,
        row.status == "failed",
        row.recorded_at,
        row.lost_count,
    )


def teams_end(conn: sa.Connection, message_id: str) -> TrialEnd:
    row = conn.execute(
        sql(
            "SELECT i.run_id, i.status, i.replied_at, coalesce(r.lost_count, 0) AS lost_count "
            "FROM teams_inbox i LEFT JOIN runs r ON r.id = i.run_id WHERE i.message_id = :m"
        ),
        {"m": message_id},
    ).first()
    if row is None:
        return TrialEnd(None, False, False, None, 0)
    return TrialEnd(
        row.run_id,
        row.status in ("replied", "failed"),
        row.status == "failed",
        row.replied_at,
        row.lost_count,
    )


@dataclass(frozen=True)
class Loss:
    """One loss of a run: the attempt lost, when the worker holding it had claimed it, and
    when the sweeper (or a parent) claimed the run from it."""

    attempt: int
    attempt_claimed_at: datetime | None
    taken_over_at: datetime


def losses(conn: sa.Connection, run_ids: list[str]) -> dict[str, list[Loss]]:
    """Each run's losses, oldest first, from the claims' own audit records."""
    rows = conn.execute(
        sql(
            "SELECT run_id, (detail->>'lost_attempt')::int AS lost_attempt, "
            "(detail->>'lost_claimed_at')::timestamptz AS lost_claimed_at, created_at "
            "FROM audit_events WHERE kind IN ('agent.run.lost', 'agent.run.failed') "
            "AND detail ? 'lost_attempt' AND run_id = ANY(CAST(:ids AS uuid[])) ORDER BY id"
        ),
        {"ids": run_ids},
    ).all()
    out: dict[str, list[Loss]] = {}
    for r in rows:
        out.setdefault(r.run_id, []).append(Loss(r.lost_attempt, r.lost_claimed_at, r.created_at))
    return out


def stale_engine_writes(conn: sa.Connection, run_id: str, attempt: int, after: datetime) -> int:
    """Rows an attempt wrote in Postgres after it was taken over (must be none, I3)."""
    row = conn.execute(
        sql(
            """
            SELECT
              (SELECT count(*) FROM runs
                WHERE id = :r AND checkpoint_attempt = :a AND checkpointed_at > :t)
            + (SELECT count(*) FROM call_marks
                WHERE run_id = :r AND attempt = :a
                  AND (marked_at > :t OR settled_at > :t))
            + (SELECT count(*) FROM audit_events
                WHERE run_id = :r AND attempt = :a AND created_at > :t) AS n
            """
        ),
        {"r": run_id, "a": attempt, "t": after},
    ).one()
    return int(row.n)


def stale_vendor_writes(vendor: sa.Connection, run_id: str, attempt: int, after: datetime) -> int:
    """Writes a vendor received from an attempt after it was taken over (must be none)."""
    row = vendor.execute(
        sql(
            "SELECT count(*) AS n FROM sim.requests WHERE run_id = :r AND attempt = :a "
            "AND method = 'POST' AND created_at > :t"
        ),
        {"r": run_id, "a": attempt, "t": after},
    ).one()
    return int(row.n)


def stale_writes(
    conn: sa.Connection, vendor: sa.Connection, run_id: str, loss: Loss
) -> tuple[int, int]:
    """What the lost attempt wrote after its takeover: rows in Postgres, requests at vendors."""
    return (
        stale_engine_writes(conn, run_id, loss.attempt, loss.taken_over_at),
        stale_vendor_writes(vendor, run_id, loss.attempt, loss.taken_over_at),
    )


# Vendors whose POSTs create something: an incident, a comment, a chat reply, a Teams reply
# (the Bot Connector), a notification. A created object answers 201; a deduplicated replay 200.
CREATING_VENDORS = ("incidents", "issues", "chat", "connector", "notify")


def duplicate_writes(vendor: sa.Connection, run_ids: list[str]) -> dict[str, int]:
    """Call sites (a run and the call that made the request: its step and tool-call id, or
    its Teams reply) at which a vendor created more than one object, whatever key each request
    carried, counted from the vendors' own records, by vendor."""
    rows = vendor.execute(
        sql(
            """
            SELECT vendor, count(*) AS sites FROM (
                SELECT vendor, run_id, call FROM sim.requests
                WHERE run_id = ANY(:ids) AND method = 'POST' AND status = 201
                  AND vendor = ANY(:vendors)
                GROUP BY vendor, run_id, call HAVING count(*) > 1) twice
            GROUP BY vendor
            """
        ),
        {"ids": run_ids, "vendors": list(CREATING_VENDORS)},
    ).all()
    found = {r.vendor: int(r.sites) for r in rows}
    return {v: found.get(v, 0) for v in CREATING_VENDORS}


@dataclass(frozen=True)
class Claim:
    """Who claimed one attempt of a run, and when (from the run's row or its loss audit)."""

    attempt: int
    claimed_at: datetime | None
    holder: str | None


def claims(conn: sa.Connection, run_id: str) -> dict[int, Claim]:
    """Every attempt's claim that the records keep: lost attempts from their loss audit, the
    current attempt from the run's row."""
    rows = conn.execute(
        sql(
            "SELECT (detail->>'lost_attempt')::int AS attempt, "
            "(detail->>'lost_claimed_at')::timestamptz AS claimed_at, "
            "detail->>'lost_holder' AS holder FROM audit_events "
            "WHERE run_id = :r AND kind IN ('agent.run.lost', 'agent.run.failed') "
            "AND detail ? 'lost_attempt' "
            "UNION ALL SELECT attempt, claimed_at, claimed_by FROM runs WHERE id = :r"
        ),
        {"r": run_id},
    ).all()
    return {r.attempt: Claim(r.attempt, r.claimed_at, r.holder) for r in rows}


def resumed_at(loss: Loss, claims: dict[int, Claim]) -> datetime | None:
    """When the attempt after `loss` was claimed (the resume's first write), or None while it
    has not been: a claim time older than the loss is a stale one left on the run's row."""
    resumed = claims.get(loss.attempt + 1)
    at = None if resumed is None else resumed.claimed_at
    return at if at is not None and at >= loss.taken_over_at else None


def teams_replies(vendor: sa.Connection, run_id: str) -> int:
    """Replies the Bot Connector received for a Teams turn (posts with the turn's reply key,
    which names the run)."""
    row = vendor.execute(
        sql("SELECT count(*) AS n FROM sim.connector_activities WHERE idem_key = :k"),
        {"k": f"lya-teams-reply-{run_id}"},
    ).one()
    return int(row.n)
