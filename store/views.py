"""Read-only views for the CLI, the demo and the metrics collector: run lists, call
settlements, model requests, and the tallies a Prometheus scrape reads.

Nothing here writes; each function takes a Connection and returns frozen rows, so `status`,
`inspect`, the demo and `/metrics` read Postgres without touching the engine's guarded
statements.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

import sqlalchemy as sa

from store.db import sql

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


def recent_runs(conn: sa.Connection, limit: int) -> list[RunSummary]:
    """The `limit` most recently created runs, newest first."""
    rows = conn.execute(
        sql(f"SELECT {_SUMMARY_COLUMNS} FROM runs ORDER BY created_at DESC, id LIMIT :n"),
        {"n": limit},
    ).all()
    return [RunSummary(**r._mapping) for r in rows]


def runs_by_ids(conn: sa.Connection, run_ids: list[str]) -> list[RunSummary]:
    """The summaries of these runs, oldest first (unknown ids are skipped)."""
    rows = conn.execute(
        sql(
            f"SELECT {_SUMMARY_COLUMNS} FROM runs WHERE id = ANY(CAST(:ids AS uuid[])) "
            "ORDER BY created_at, id"
        ),
        {"ids": run_ids},
    ).all()
    return [RunSummary(**r._mapping) for r in rows]


def mark_tally(conn: sa.Connection, run_ids: list[str]) -> list[MarkTally]:
    """Call marks of these runs counted by kind, status and settlement."""
    rows = conn.execute(
        sql(
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
        sql(
            "SELECT run_id, tool, kind, idem_key FROM call_marks "
            "WHERE run_id = ANY(CAST(:ids AS uuid[])) ORDER BY run_id, step, call_index"
        ),
        {"ids": run_ids},
    ).all()
    return [MarkKey(**r._mapping) for r in rows]


def database_now(conn: sa.Connection) -> datetime:
    """The database's wall clock, so durations compare with its own timestamps (no skew)."""
    value: datetime = conn.execute(sql("SELECT clock_timestamp()")).scalar_one()
    return value


@dataclass(frozen=True)
class RunCount:
    """How many runs of one kind are in one status now."""

    kind: str
    status: str
    n: int


@dataclass(frozen=True)
class LossTally:
    """Audited losses and what followed them, over the whole audit history."""

    crash_resumed: int
    handed_back: int
    lost: int
    # Claims that failed the run instead of requeuing it (loss limit, or not resumable).
    failed_by_loss: int


@dataclass(frozen=True)
class DurationHistogram:
    """Observations counted at or under each bound (cumulative), their count and sum."""

    cumulative: list[int]
    count: int
    sum_s: float


def run_counts(conn: sa.Connection) -> list[RunCount]:
    """Runs counted by kind and status (only the pairs that have runs)."""
    rows = conn.execute(
        sql(
            "SELECT kind, status, count(*) AS n FROM runs GROUP BY kind, status "
            "ORDER BY kind, status"
        )
    ).all()
    return [RunCount(**r._mapping) for r in rows]


def loss_tally(conn: sa.Connection) -> LossTally:
    """Crash resumes, hand-backs, losses and loss failures, counted from the audit."""
    row = conn.execute(
        sql(
            """
            SELECT count(*) FILTER (WHERE kind = 'agent.run.crash_resumed') AS crash_resumed,
                   count(*) FILTER (WHERE kind = 'agent.run.handed_back') AS handed_back,
                   count(*) FILTER (WHERE kind = 'agent.run.lost') AS lost,
                   count(*) FILTER (WHERE kind = 'agent.run.failed'
                                    AND detail ->> 'lost_attempt' IS NOT NULL) AS failed_by_loss
            FROM audit_events
            WHERE kind IN ('agent.run.crash_resumed', 'agent.run.handed_back',
                           'agent.run.lost', 'agent.run.failed')
            """
        )
    ).one()
    return LossTally(**row._mapping)


def failures_by_code(conn: sa.Connection) -> dict[str, int]:
    """Audited run failures by their code (a failing claim writes `interrupted` or
    `loss_limit`)."""
    rows = conn.execute(
        sql(
            """
            SELECT coalesce(detail ->> 'code', 'unknown') AS code,
                   count(*) AS n
            FROM audit_events WHERE kind = 'agent.run.failed'
            GROUP BY 1 ORDER BY 1
            """
        )
    ).all()
    return {r.code: r.n for r in rows}


def settlement_counts(conn: sa.Connection) -> dict[str, int]:
    """Marked calls with an outcome by how they ended: their settlement, or `sent` for a call
    whose outcome was recorded on its first pass (calls still in doubt are not counted)."""
    rows = conn.execute(
        sql(
            """
            SELECT coalesce(settlement, 'sent') AS settlement, count(*) AS n FROM call_marks
            WHERE settlement IS NOT NULL OR status = 'done'
            GROUP BY 1 ORDER BY 1
            """
        )
    ).all()
    return {r.settlement: r.n for r in rows}


def recovery_histogram(conn: sa.Connection, bounds: list[float]) -> DurationHistogram:
    """Seconds from each `agent.run.lost` event to the run's next `agent.run.crash_resumed`
    (losses not yet resumed are left out), counted under each bound."""
    row = conn.execute(
        sql(
            """
            WITH d AS (
                SELECT EXTRACT(EPOCH FROM r.created_at - l.created_at) AS s
                FROM audit_events l
                JOIN LATERAL (
                    SELECT created_at FROM audit_events n
                    WHERE n.run_id = l.run_id AND n.kind = 'agent.run.crash_resumed'
                      AND n.id > l.id
                    ORDER BY n.id LIMIT 1) r ON true
                WHERE l.kind = 'agent.run.lost')
            SELECT (SELECT count(*) FROM d) AS n,
                   (SELECT CAST(coalesce(sum(s), 0) AS float8) FROM d) AS sum_s,
                   ARRAY(SELECT (SELECT count(*) FROM d WHERE d.s <= b.le)
                         FROM unnest(CAST(:bounds AS float8[])) WITH ORDINALITY AS b(le, i)
                         ORDER BY b.i) AS cumulative
            """
        ),
        {"bounds": bounds},
    ).one()
    return DurationHistogram(cumulative=list(row.cumulative), count=row.n, sum_s=row.sum_s)


def waiting_counts(conn: sa.Connection) -> dict[str, int]:
    """Waiting runs by what they wait on: approval, child or timer (`unknown` if unset)."""
    rows = conn.execute(
        sql(
            """
            SELECT coalesce(nullif(split_part(waiting_on, ':', 1), ''), 'unknown') AS on_what,
                   count(*) AS n
            FROM runs WHERE status = 'waiting' GROUP BY 1 ORDER BY 1
            """
        )
    ).all()
    return {r.on_what: r.n for r in rows}


# Who a run waiting for a model endpoint is counted for (liyagent_model_waiting_runs{tenant}):
# its tenant (runtime/flow/tenants.py), or its owner for a run stored before tenants existed
# (its tenant NULL), as a tenant defaults to the owner. One expression, used wherever a
# tenant is read for the metrics.
TENANT_SQL = "coalesce(tenant, owner)"


@dataclass(frozen=True)
class ModelWaiting:
    """Runs waiting now for one model endpoint's capacity, of one tenant."""

    endpoint: str
    tenant: str
    n: int


def model_waiting_counts(conn: sa.Connection) -> list[ModelWaiting]:
    """Runs suspended on a model endpoint (`model:<profile>:<until>[:<reason>]`, the profile
    the second part, as the sweeper's wake reads the third), by endpoint and tenant."""
    rows = conn.execute(
        sql(
            f"""
            SELECT split_part(waiting_on, ':', 2) AS endpoint, {TENANT_SQL} AS tenant,
                   count(*) AS n
            FROM runs WHERE status = 'waiting' AND waiting_on LIKE 'model:%'
            GROUP BY 1, 2 ORDER BY 1, 2
            """
        )
    ).all()
    return [ModelWaiting(r.endpoint, r.tenant, r.n) for r in rows]


def oldest_queued_age_s(conn: sa.Connection) -> float:
    """Seconds the longest-queued run has been queued (0 when none is): since it entered the
    status (`updated_at`), as `queued_at` is restamped each time a sweep republishes it."""
    value = conn.execute(
        sql(
            "SELECT CAST(EXTRACT(EPOCH FROM clock_timestamp() - min(updated_at)) AS float8) "
            "FROM runs WHERE status = 'queued'"
        )
    ).scalar_one()
    return 0.0 if value is None else float(value)


def runs_by_id_prefix(conn: sa.Connection, hex_prefix: str, limit: int) -> list[RunSummary]:
    """Runs whose id starts with these hex digits (dashes left out), oldest first, at most
    `limit`: a range scan of the primary key between the prefix padded with 0s and with fs."""
    low, high = (_as_uuid(hex_prefix.ljust(32, pad)) for pad in "0f")
    rows = conn.execute(
        sql(
            f"SELECT {_SUMMARY_COLUMNS} FROM runs "
            "WHERE id BETWEEN CAST(:low AS uuid) AND CAST(:high AS uuid) "
            "ORDER BY created_at, id LIMIT :n"
        ),
        {"low": low, "high": high, "n": limit},
    ).all()
    return [RunSummary(**r._mapping) for r in rows]


def _as_uuid(hex32: str) -> str:
    h = hex32
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"
