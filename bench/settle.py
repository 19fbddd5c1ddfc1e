"""Waiting for Postgres's statistics to settle around a measured window (bench/counts.py):
its cumulative counters reach the shared statistics only when a backend flushes them (at most
once a second while busy, after 10 s idle, or when it exits)."""

from __future__ import annotations

import time
from typing import Any

import sqlalchemy as sa

from bench.lab import Lab

# How long a backend must be idle for its statistics to have been flushed.
IDLE_FLUSH_S = 10.5
# The most any one wait here takes.
SETTLE_LIMIT_S = 40.0


def backends(lab: Lab, dbs: list[str]) -> list[Any]:
    """The client backends on `dbs`: their state and how long since it changed."""
    with lab.admin() as conn:
        return list(
            conn.execute(
                sa.text(
                    "SELECT datname, state, EXTRACT(EPOCH FROM now() - state_change) AS idle_s "
                    "FROM pg_stat_activity "
                    "WHERE datname = ANY(:dbs) AND backend_type = 'client backend'"
                ),
                {"dbs": dbs},
            ).all()
        )


def window_limit(settle_s: float) -> float:
    """How long the waits before a window take at most: a worker's sweeps (every 3 s) keep its
    own backend from ever idling 10.5 s, so they often run out; a quick bench waits less."""
    return min(SETTLE_LIMIT_S, max(5.0, 4 * settle_s))


def settled(lab: Lab, dbs: list[str], idle_s: float, limit_s: float = SETTLE_LIMIT_S) -> bool:
    """Wait (at most `limit_s`) until every backend on `dbs` has been idle for `idle_s`."""
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        rows = backends(lab, dbs)
        if all(
            r.state == "idle" and r.idle_s is not None and float(r.idle_s) >= idle_s for r in rows
        ):
            return True
        time.sleep(0.25)
    return False


def gone(lab: Lab, dbs: list[str]) -> bool:
    """Wait (bounded) until no backend is connected to `dbs` (each flushed its statistics)."""
    deadline = time.monotonic() + SETTLE_LIMIT_S
    while time.monotonic() < deadline:
        if not backends(lab, dbs):
            return True
        time.sleep(0.1)
    return False


def flushed_or_note(lab: Lab, dbs: list[str], notes: list[str], settle_s: float) -> None:
    """Wait until the bench's own short connections (which read the table counters) are gone:
    their statistics are flushed when they exit, before the window opens."""
    deadline = time.monotonic() + window_limit(settle_s)
    while time.monotonic() < deadline:
        rows = backends(lab, dbs)
        # The workers' own idle connections stay; the bench's closed ones disappear. A backend
        # idle for less than the flush interval is one that has just run a statement.
        if all(r.state == "idle" and float(r.idle_s or 0) >= settle_s for r in rows):
            return
        time.sleep(0.1)
    notes.append("the bench's own counter reads were still connected when the window opened")
