"""Read-only views for the CLI and the demo: run lists, call settlements, model requests.

Nothing here writes; each function takes a Connection and returns frozen rows, so `status`,
`inspect` and the demo read Postgres without touching the engine's guarded statements.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

import sqlalchemy as sa

_SUMMARY_COLUMNS = (
    "id, agent, kind, status, attempt, lost_count, step, failure_reason, created_at, "
    "started_at, finished_at"
)


@dataclass(frozen=True)
class RunSummary:
    """A run's lifecycle columns, without its spec or sealed answer."""

    id: str
    agent: str
    # agent (a model loop) or workflow (a deterministic step graph).
    kind: str
    status: str
    attempt: int
    lost_count: int
    step: int
    failure_reason: str | None
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None


@dataclass(frozen=True)
class MarkTally:
    """How many call marks of one kind ended in one status and settlement."""

    kind: str
    status: str
    settlement: str | None
    n: int


@dataclass(frozen=True)
class MarkKey:
    """The idempotency key a marked call was sent with, to match the vendor's records."""

    run_id: str
    tool: str
    kind: str
    idem_key: str


@dataclass(frozen=True)
class ModelRequest:
    """One time a model provider was asked for a step of a run."""

    step: int
    attempt: int
    provider: str
    created_at: datetime


def recent_runs(conn: sa.Connection, limit: int) -> list[RunSummary]:
    """The `limit` most recently created runs, newest first."""
    rows = conn.execute(
        sa.text(f"SELECT {_SUMMARY_COLUMNS} FROM runs ORDER BY created_at DESC, id LIMIT :n"),
        {"n": limit},
    ).all()
    return [RunSummary(**r._mapping) for r in rows]


def runs_by_ids(conn: sa.Connection, run_ids: list[str]) -> list[RunSummary]:
    """The summaries of these runs, oldest first (unknown ids are skipped)."""
    rows = conn.execute(
        sa.text(
            f"SELECT {_SUMMARY_COLUMNS} FROM runs WHERE id = ANY(CAST(:ids AS uuid[])) "
            "ORDER BY created_at, id"
        ),
        {"ids": run_ids},
    ).all()
    return [RunSummary(**r._mapping) for r in rows]


def mark_tally(conn: sa.Connection, run_ids: list[str]) -> list[MarkTally]:
    """Call marks of these runs counted by kind, status and settlement."""
    rows = conn.execute(
        sa.text(
            "SELECT kind, status, settlement, count(*) AS n FROM call_marks "
            "WHERE run_id = ANY(CAST(:ids AS uuid[])) "
            "GROUP BY kind, status, settlement ORDER BY kind, status, settlement"
        ),
        {"ids": run_ids},
    ).all()
    return [MarkTally(**r._mapping) for r in rows]


def mark_keys(conn: sa.Connection, run_ids: list[str]) -> list[MarkKey]:
    """The idempotency keys of every marked call of these runs."""
    rows = conn.execute(
        sa.text(
            "SELECT run_id, tool, kind, idem_key FROM call_marks "
            "WHERE run_id = ANY(CAST(:ids AS uuid[])) ORDER BY run_id, step, call_index"
        ),
        {"ids": run_ids},
    ).all()
    return [MarkKey(**r._mapping) for r in rows]


def model_requests(conn: sa.Connection, run_id: str) -> list[ModelRequest]:
    """Every model request of one run, by step then time."""
    rows = conn.execute(
        sa.text(
            "SELECT step, attempt, provider, created_at FROM model_requests "
            "WHERE run_id = :id ORDER BY step, id"
        ),
        {"id": run_id},
    ).all()
    return [ModelRequest(**r._mapping) for r in rows]


def database_now(conn: sa.Connection) -> datetime:
    """The database's wall clock, so durations compare with its own timestamps (no skew)."""
    value: datetime = conn.execute(sa.text("SELECT clock_timestamp()")).scalar_one()
    return value
