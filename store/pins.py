"""A run's pin and its waits for a worker whose code serves it (runtime/core/drift.py): each a
conditional statement of the attempt that owns the run (I3: a taken-over attempt changes
nothing and stops)."""

from __future__ import annotations

import sqlalchemy as sa

from store.db import sql
from store.rows import FencedOut

# A run waiting for a worker whose code serves its pin: `definition:<pin id>:<retry at>`, woken
# by the sweeper at its retry time (store/waits.py `wake_ready`).
DEFINITION_WAIT = "definition:"


class Drifted:
    """How long a run has waited for a worker that serves its pin, and whether this is the
    first attempt to find it unserved."""

    def __init__(self, waited_s: float, first: bool) -> None:
        self.waited_s = waited_s
        self.first = first


def note_drift(conn: sa.Connection, run_id: str, attempt: int) -> Drifted:
    """This attempt's worker cannot serve the run's pin: since when the run has waited (set by
    the first such attempt, kept by the next ones)."""
    row = conn.execute(
        sql(
            """
            UPDATE runs SET drift_since = coalesce(drift_since, now())
            WHERE id = :run_id AND attempt = :attempt AND status = 'running'
            RETURNING extract(epoch FROM now() - drift_since) AS waited_s,
                      drift_since = now() AS first
            """
        ),
        {"run_id": run_id, "attempt": attempt},
    ).first()
    if row is None:
        raise FencedOut(run_id, attempt, "note a definition drift")
    return Drifted(float(row.waited_s), bool(row.first))


def drift_served(conn: sa.Connection, run_id: str, attempt: int) -> float | None:
    """A worker serves the pin of a run that waited for one: it waits no more. How long it
    waited (None: it was not waiting, or this attempt no longer owns it)."""
    row = conn.execute(
        sql(
            """
            UPDATE runs r SET drift_since = NULL
            FROM (SELECT id, drift_since FROM runs WHERE id = :run_id) old
            WHERE r.id = old.id AND r.attempt = :attempt AND r.status = 'running'
              AND old.drift_since IS NOT NULL
            RETURNING extract(epoch FROM now() - old.drift_since) AS waited_s
            """
        ),
        {"run_id": run_id, "attempt": attempt},
    ).first()
    return None if row is None else float(row.waited_s)


def repin(conn: sa.Connection, run_id: str, attempt: int, pin: bytes) -> None:
    """A run that follows the latest definition takes this worker's (sealed `pin`)."""
    row = conn.execute(
        sql(
            "UPDATE runs SET pin = :pin, drift_since = NULL "
            "WHERE id = :run_id AND attempt = :attempt AND status = 'running' RETURNING id"
        ),
        {"run_id": run_id, "attempt": attempt, "pin": pin},
    ).first()
    if row is None:
        raise FencedOut(run_id, attempt, "re-pin its definition")


def note_code(conn: sa.Connection, code: str) -> None:
    """The fleet sees code version `code`: noted with the time it was first seen, kept after
    (the first process of a deploy to start notes it; the others find it)."""
    conn.execute(
        sql("INSERT INTO code_versions (id) VALUES (:code) ON CONFLICT (id) DO NOTHING"),
        {"code": code},
    )


def newer_code(conn: sa.Connection, mine: str, pinned: str) -> bool | None:
    """Whether code version `mine` was first seen after `pinned` (one never noted is older
    than any: its code ran before versions were noted); None when `mine` is not noted (its
    row gone: a database restored from before it)."""
    row = conn.execute(
        sql(
            """
            SELECT (SELECT first_seen FROM code_versions WHERE id = :mine)
                   > coalesce((SELECT first_seen FROM code_versions WHERE id = :pinned),
                              '-infinity') AS newer
            """
        ),
        {"mine": mine, "pinned": pinned},
    ).one()
    return None if row.newer is None else bool(row.newer)
