"""A tenant's share of the fleet (runtime/flow/tenants.py): its runs in flight counted, a new
run past its bound held (waiting on `tenant`), and held runs admitted in their turn as room
frees. Every decision is taken under the tenant's advisory lock, in its own transaction, after
the lock (a statement's snapshot is taken before it waits for a lock): of two starts or two
admissions for one tenant, the second counts what the first stored."""

from __future__ import annotations

from dataclasses import dataclass

import sqlalchemy as sa

from store.db import sql
from store.rows import Attempt, RunId

# A tenant's runs in flight: started or about to be (queued), running, handing its answer on,
# or suspended on a model endpoint's capacity (woken together when it opens: counted, or a
# close would let a tenant's whole backlog through its bound). Runs waiting on a person, a
# child or a timer, and held runs, are not counted. The partial index `ix_runs_tenant_live`
# has this predicate.
IN_FLIGHT_SQL = (
    "(status IN ('queued','running','answered') "
    "OR (status = 'waiting' AND waiting_on LIKE 'model:%'))"
)
# A held run waits on this: its tenant's runs in flight at their bound.
HELD_ON = "tenant"


@dataclass(frozen=True)
class Admitted:
    """A held run admitted: queued at its first attempt, to be published at its priority."""

    run_id: RunId
    attempt: Attempt
    priority: int


def lock_tenant(conn: sa.Connection, tenant: str) -> None:
    """Hold the tenant's advisory lock until the caller's transaction ends (it must be in one)."""
    conn.execute(
        sql("SELECT pg_advisory_xact_lock(hashtextextended('liyagent.tenant:' || :t, 0))"),
        {"t": tenant},
    )


def admit_held(conn: sa.Connection, tenant: str, limit: int | None) -> list[Admitted]:
    """Admit the tenant's held runs while it has room under `limit` (None: the bound was
    lifted, every held run goes), highest priority first, then oldest: each becomes queued at
    its first attempt, audited, in one statement. The caller holds the tenant's lock
    (`lock_tenant`), so two admissions never both fill the same room (I4: a run is admitted
    once; the status guard makes a repeat match nothing)."""
    rows = conn.execute(
        sql(
            f"""
            WITH room AS (
                SELECT CAST(:limit AS int) - count(*) AS n FROM runs
                WHERE tenant = :t AND {IN_FLIGHT_SQL}),
            pick AS (
                SELECT id FROM runs
                WHERE tenant = :t AND status = 'waiting' AND waiting_on = '{HELD_ON}'
                ORDER BY priority DESC, queued_at, id
                LIMIT CASE WHEN CAST(:limit AS int) IS NULL THEN NULL
                           ELSE GREATEST((SELECT n FROM room), 0) END),
            w AS (
                UPDATE runs SET status = 'queued', waiting_on = NULL, queued_at = now(),
                       updated_at = now()
                FROM pick
                WHERE runs.id = pick.id AND runs.status = 'waiting'
                  AND runs.waiting_on = '{HELD_ON}'
                RETURNING runs.id, runs.attempt, runs.priority, runs.step),
            a AS (
                INSERT INTO audit_events (run_id, kind, attempt, step, detail)
                SELECT id, 'agent.run.admitted', attempt, step,
                       jsonb_build_object('tenant', CAST(:t AS text),
                                          'limit', CAST(:limit AS int))
                FROM w)
            SELECT id, attempt, priority FROM w ORDER BY priority DESC
            """
        ),
        {"t": tenant, "limit": limit},
    ).all()
    return [Admitted(RunId(r.id), Attempt(r.attempt), r.priority) for r in rows]


def held_tenants(conn: sa.Connection) -> dict[str, int]:
    """Every tenant with runs held now, and its runs in flight (the sweep admits those with
    room): one statement, over the held runs' and the live runs' partial indexes."""
    rows = conn.execute(
        sql(
            f"""
            SELECT h.tenant, (SELECT count(*) FROM runs
                              WHERE tenant = h.tenant AND {IN_FLIGHT_SQL}) AS n
            FROM (SELECT DISTINCT tenant FROM runs WHERE status = 'waiting'
                  AND waiting_on = '{HELD_ON}' AND tenant IS NOT NULL) h
            """
        )
    ).all()
    return {r.tenant: int(r.n) for r in rows}
