"""Bulk rows for the benchmarks (and the tests that time the sweeper at scale): many running
runs in one statement, so the sweeper and the fenced statements can be timed at scale without
starting runs one by one. Harness SQL, so it lives with the bench, not in `store/`."""

from __future__ import annotations

import sqlalchemy as sa

from store.db import sql
from store.rows import RunId


def insert_running_runs(
    conn: sa.Connection, count: int, holder: str = "bench", agent: str = "bench"
) -> list[RunId]:
    """Insert `count` runs already running at attempt 1, claimed by `holder`; their ids."""
    rows = conn.execute(
        sql(
            """
            INSERT INTO runs (id, correlation_id, agent, owner, entry_kind, status,
                              attempt, started_at, claimed_by, claimed_at)
            SELECT id, CAST(id AS text), :agent, 'bench', 'plain',
                   'running', 1, now(), :holder, now()
            FROM (SELECT gen_random_uuid() AS id FROM generate_series(1, :count)) AS g
            RETURNING id
            """
        ),
        {"count": count, "holder": holder, "agent": agent},
    ).all()
    return [RunId(str(r.id)) for r in rows]


def finish_runs(conn: sa.Connection, run_ids: list[str]) -> None:
    """Mark these runs succeeded: claimed runs the bench has no worker for leave the queue, so
    later samples do not also time the outbox republishing a growing backlog."""
    conn.execute(
        sql(
            "UPDATE runs SET status = 'succeeded', finished_at = now() "
            "WHERE id = ANY(CAST(:ids AS uuid[]))"
        ),
        {"ids": run_ids},
    )
