"""Events published to whichever workflows wait for them (a workflow's `wait_event`).

A signal is sent to one run; an event is published by name (and a match value, such as an order
id) to every workflow that waits for it, now or later: a wait takes the first event of its name
and match published after it first met its step (`since`, the newest event id then, recorded
with the step). A publish is one statement: the event stored and every run waiting for it woken;
a run that was about to wait when the event came is woken by the sweeper's `wake_ready` within a
sweep. A publisher's key makes a publish idempotent (the same key stores nothing more). An event
a front principal published reaches only that principal's runs; one published inside the
deployment (no principal) reaches every run.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa

from store.db import sql, to_json
from store.rows import Attempt, RunId


def event_digest(name: str, match: str | None) -> str:
    """What a wait for `name` (with `match`) waits on, in its `waiting_on` and the event's row."""
    return hashlib.sha256(f"{name}\0{match or ''}".encode()).hexdigest()[:20]


@dataclass(frozen=True)
class Published:
    """What a publish did: the event's id, whether this publish stored it (False: its key had
    published it before), and the runs it woke (each at its new attempt, to publish)."""

    event_id: int
    new: bool
    woke: list[tuple[RunId, Attempt]]


def publish_event(
    conn: sa.Connection,
    *,
    name: str,
    match: str | None,
    payload: Any,
    key: str,
    by: str,
    principal: str | None = None,
) -> Published:
    """Store the event and wake every run waiting for its name and match that it reaches (its
    `principal`'s, or every run's when None), in one statement."""
    digest = event_digest(name, match)
    # Held to this transaction's end: a wait's start (`newest_event_id`) waits for this
    # event's commit, so no event of its digest commits later with a smaller id.
    conn.execute(sql("SELECT pg_advisory_xact_lock(hashtext(:d))"), {"d": digest})
    rows = conn.execute(
        sql(
            """
            WITH put AS (
                INSERT INTO workflow_events (name, match, digest, payload, key, sent_by,
                                             principal)
                VALUES (:name, :match, :digest, CAST(:payload AS jsonb), :key, :by,
                        coalesce(:principal, ''))
                ON CONFLICT (name, principal, key) DO UPDATE SET key = EXCLUDED.key
                RETURNING id, (xmax = 0) AS created),
            w AS (
                UPDATE runs SET status = 'queued', attempt = attempt + 1, deliveries = 0,
                       resume_reason = 'wait_over', waiting_on = NULL, queued_at = now(),
                       updated_at = now()
                WHERE status = 'waiting' AND split_part(waiting_on, ':', 1) = 'event'
                  AND split_part(waiting_on, ':', 2) = :digest
                  AND (CAST(:principal AS text) IS NULL OR principal = :principal)
                  AND EXISTS (SELECT 1 FROM put WHERE created)
                RETURNING id, attempt)
            SELECT put.id AS event_id, put.created, w.id AS run_id, w.attempt
            FROM put LEFT JOIN w ON true
            """
        ),
        {
            "name": name,
            "match": match or "",
            "digest": digest,
            "payload": to_json(payload),
            "key": key,
            "by": by,
            "principal": principal,
        },
    ).all()
    woke = [(RunId(r.run_id), Attempt(r.attempt)) for r in rows if r.run_id is not None]
    return Published(int(rows[0].event_id), bool(rows[0].created), woke)


def newest_event_id(conn: sa.Connection, digest: str) -> int:
    """The newest event's id waited on as `digest` (0 when none), once every publish of that
    digest in flight has committed (their lock): a wait takes only events after it, and no
    event of its digest commits later with a smaller id. In the caller's transaction."""
    conn.execute(sql("SELECT pg_advisory_xact_lock(hashtext(:d))"), {"d": digest})
    return int(
        conn.execute(
            sql("SELECT coalesce(max(id), 0) FROM workflow_events WHERE digest = :d"),
            {"d": digest},
        ).scalar_one()
    )


# Whether event `e` reaches a run whose principal is `{run}`.
REACHES = "(e.principal = '' OR e.principal = {run})"


def first_event_after(
    conn: sa.Connection, digest: str, since: int, principal: str | None
) -> tuple[int, Any] | None:
    """The first event waited on as `digest` published after event `since` that reaches a run
    of `principal`: (id, payload)."""
    row = conn.execute(
        sql(
            f"SELECT id, payload FROM workflow_events e WHERE digest = :digest AND id > :since "
            f"AND {REACHES.format(run='CAST(:principal AS text)')} ORDER BY id LIMIT 1"
        ),
        {"digest": digest, "since": since, "principal": principal},
    ).first()
    return None if row is None else (int(row.id), row.payload)


# The sweeper's backstop (store/waits.py `wake_ready`): a run waiting on
# `event:<digest>:<since>:<deadline or never>` whose event came, or whose wait timed out.
WAKE_SQL = f"""(split_part(r.waiting_on, ':', 1) = 'event' AND (
    EXISTS (SELECT 1 FROM workflow_events e WHERE e.digest = split_part(r.waiting_on, ':', 2)
            AND e.id > CAST(split_part(r.waiting_on, ':', 3) AS bigint)
            AND {REACHES.format(run="r.principal")})
    OR (split_part(r.waiting_on, ':', 4) <> 'never'
        AND to_timestamp(CAST(split_part(r.waiting_on, ':', 4) AS float8)) <= now())))"""
