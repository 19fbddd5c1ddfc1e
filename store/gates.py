"""Gate statements: what a run may do now (containment, Stop, channel, run-as, owner)."""

from __future__ import annotations

from dataclasses import fields
from typing import Any, NamedTuple

import sqlalchemy as sa

from store.db import sql
from store.entries import ends_cte
from store.rows import GateRow, QueuedAttempt, StopRow
from store.states import RunStatus
from store.tenants import HELD_ON

# The gates of each run row `r` of a statement's source, and that row's attempt and status
# (the fence): a statement that claims or checkpoints a run reads them in its own round trip.
# With them, for a first attempt a loss's claim asked to yield (resumed runs first), the lost
# run to yield to: the one it was asked for while still queued, else any lost run still queued
# (the broker serves lost runs in the order they were published, not the order of the asks, so
# a slot freed by another yield may have taken this one's). None when no lost run waits any
# more: nobody yields for nothing. Read only for an asked run: a normal step pays nothing.
# `r` has `yield_for`.
_GATE_COLUMNS = """
    s.reason AS stop_reason, s.created_by AS stop_by,
    coalesce(o.may_run, true) AS owner_may_run, o.reason AS owner_reason,
    coalesce(a.may_act, true) AS run_as_may_act, a.reason AS run_as_reason,
    coalesce(c.enabled, true) AS channel_enabled, c.reason AS channel_reason,
    (SELECT array_agg(t.tool) FROM agent_tools t WHERE t.agent = r.agent) AS agent_tools,
    r.attempt AS run_attempt, r.status AS run_status,
    coalesce(r.on_stop = 'compensating', false) AS compensating,
    EXISTS (SELECT 1 FROM signals g WHERE g.run_id = r.id
            AND (g.taken_by IS NULL OR g.taken_by = 'agent:' || r.step)) AS signals_waiting,
    CASE WHEN r.yield_for IS NOT NULL AND r.attempt = 1 THEN coalesce(
        (SELECT CAST(y.id AS text) FROM runs y WHERE y.id = r.yield_for AND y.status = 'queued'),
        (SELECT CAST(y.id AS text) FROM runs y
         WHERE y.status = 'queued' AND y.resume_reason = 'lost' LIMIT 1))
    END AS yield_to"""
_GATE_JOINS = """
    LEFT JOIN principals o ON o.name = r.owner
    LEFT JOIN principals a ON a.name = coalesce(r.run_as, r.owner)
    LEFT JOIN channels c ON c.name = r.channel
    LEFT JOIN LATERAL (
        SELECT reason, created_by FROM stops
        WHERE lifted_at IS NULL AND (stops.run_id = r.id OR stops.agent = r.agent)
        ORDER BY id LIMIT 1) s ON true"""
GATE_FIELDS = frozenset(f.name for f in fields(GateRow))


def gates_of(source: str, also: str = "") -> str:
    """A SELECT of the gates of each row of `source` (run rows, aliased `r`), after the columns
    `also` of that row (e.g. `r.*, `)."""
    return f"SELECT {also}{_GATE_COLUMNS} FROM {source} r {_GATE_JOINS}"


def gate_row(row: sa.Row[Any]) -> GateRow:
    """The gates in a row a `gates_of` SELECT returned."""
    m = row._mapping
    tools = m["agent_tools"]
    return GateRow(
        **{k: m[k] for k in GATE_FIELDS - {"agent_tools", "run_status"}},
        agent_tools=None if tools is None else frozenset(tools),
        run_status=RunStatus(m["run_status"]),
    )


def select_gates(conn: sa.Connection, run_id: str) -> GateRow:
    """Every gate of the run as it stands now, with its fence, in one statement."""
    return gate_row(conn.execute(sql(gates_of("runs") + " WHERE r.id = :id"), {"id": run_id}).one())


def set_principal(
    conn: sa.Connection, name: str, *, may_run: bool, may_act: bool, reason: str | None
) -> None:
    conn.execute(
        sql(
            """
            INSERT INTO principals (name, may_run, may_act, reason) VALUES (:n, :r, :a, :why)
            ON CONFLICT (name) DO UPDATE SET may_run = :r, may_act = :a, reason = :why,
                updated_at = now()
            """
        ),
        {"n": name, "r": may_run, "a": may_act, "why": reason},
    )


def set_channel(conn: sa.Connection, name: str, *, enabled: bool, reason: str | None) -> None:
    conn.execute(
        sql(
            """
            INSERT INTO channels (name, enabled, reason) VALUES (:n, :e, :why)
            ON CONFLICT (name) DO UPDATE SET enabled = :e, reason = :why, updated_at = now()
            """
        ),
        {"n": name, "e": enabled, "why": reason},
    )


def set_agent_tools(conn: sa.Connection, agent: str, tools: list[str]) -> None:
    """Replace the agent's containment list (an empty list leaves it unrestricted)."""
    conn.execute(
        sql(
            """
            WITH d AS (DELETE FROM agent_tools WHERE agent = :agent)
            INSERT INTO agent_tools (agent, tool) SELECT :agent, unnest(CAST(:tools AS text[]))
            """
        ),
        {"agent": agent, "tools": tools},
    )


class Stopping(NamedTuple):
    """What a Stop did: the runs it failed, and the workflows that catch a Stop it queued for an
    attempt that raises it in their function (each to publish)."""

    failed: list[str]
    compensating: list[QueuedAttempt]


def insert_stop(
    conn: sa.Connection,
    *,
    run_id: str | None,
    agent: str | None,
    reason: str,
    by: str,
    running: bool = True,
    compensate: bool = True,
) -> Stopping:
    """Record a Stop, audited, and end every run it covers at once, in one statement: a run's
    Stop covers its children and theirs (each gets a stop of its own, so a child started
    later by nobody can run). Queued and waiting runs fail; running ones fail with their
    attempt bumped, so whatever their attempt in flight tries to write next matches nothing
    (I3), as after a claim. Entry points are told, each failure audited with code `stopped`.
    A run with a stored answer not yet handed on (answered) is refused at its hand-on, which
    passes the gates as they stand (its entry points are told). `running=False` leaves running
    runs to the caller (an erasure fences them out itself).

    A workflow that catches a Stop (`on_stop = 'compensate'`, with `compensate`) is not failed:
    its attempt is bumped all the same (its attempt in flight writes nothing more, I3) and it is
    queued `compensating`, for an attempt that raises the Stop in its function; a second Stop
    fails it like any run."""
    # A run held for its tenant's room never started: nothing to undo, it fails as any run.
    catches = (
        "(on_stop IS NOT DISTINCT FROM 'compensate' AND :compensate "
        f"AND waiting_on IS DISTINCT FROM '{HELD_ON}')"
    )
    rows = conn.execute(
        sql(
            f"""
            WITH RECURSIVE tree AS (
                SELECT id, 0 AS depth FROM runs WHERE id = CAST(:run_id AS uuid)
                UNION
                SELECT c.id, t.depth + 1 FROM runs c JOIN tree t ON c.parent_run_id = t.id
                WHERE t.depth < 50),
            s AS (
                INSERT INTO stops (run_id, agent, reason, created_by)
                VALUES (:run_id, :agent, :reason, :by) RETURNING id),
            below AS (
                INSERT INTO stops (run_id, agent, reason, created_by)
                SELECT r.id, NULL, 'its parent run was stopped: ' || :reason, :by
                FROM runs r JOIN tree t ON t.id = r.id
                WHERE t.depth > 0 AND r.status NOT IN ('succeeded', 'failed')),
            sa AS (
                INSERT INTO audit_events (run_id, kind, detail)
                SELECT CAST(:run_id AS uuid), 'agent.stop.created',
                       jsonb_build_object('stop_id', s.id, 'agent', CAST(:agent AS text),
                                          'by', CAST(:by AS text),
                                          'reason', CAST(:reason AS text))
                FROM s),
            f AS (
                UPDATE runs SET status = 'failed', finished_at = now(), updated_at = now(),
                       waiting_on = NULL,
                       attempt = attempt + CASE WHEN status = 'running' THEN 1 ELSE 0 END,
                       failure_reason = 'stopped by ' || :by || ': ' || :reason
                WHERE (status IN ('queued', 'waiting') OR (status = 'running' AND :running))
                  AND (id IN (SELECT id FROM tree) OR agent = :agent) AND NOT {catches}
                RETURNING id, attempt, step, failure_reason),
            comp AS (
                UPDATE runs SET status = 'queued', waiting_on = NULL, on_stop = 'compensating',
                       attempt = attempt + 1, deliveries = 0, resume_reason = 'stopped',
                       updated_at = now(), queued_at = now()
                WHERE status IN ('queued', 'waiting', 'running')
                  AND (id IN (SELECT id FROM tree) OR agent = :agent) AND {catches}
                RETURNING id, attempt, step, priority),
            t AS (
                INSERT INTO transcript_messages (run_id, role, content)
                SELECT id, 'notice', 'This run was stopped by ' || :by || ': ' || :reason
                FROM f
                UNION ALL
                SELECT id, 'notice', 'This run was stopped by ' || :by || ': ' || :reason
                       || '; its workflow undoes what it did before it ends'
                FROM comp),
            a AS (
                INSERT INTO audit_events (run_id, kind, attempt, step, detail)
                SELECT f.id, 'agent.run.failed', f.attempt, f.step,
                       jsonb_build_object('code', 'stopped', 'stop_id', s.id,
                                          'by', CAST(:by AS text),
                                          'reason', f.failure_reason)
                FROM f, s)
            {ends_cte("f", success=False, outcome_sql="f.failure_reason")}
            SELECT f.id, 0 AS attempt, 0 AS priority, false AS compensating FROM f, s
            UNION ALL
            SELECT comp.id, comp.attempt, comp.priority, true FROM comp, s
            """
        ),
        {
            "run_id": run_id,
            "agent": agent,
            "reason": reason,
            "by": by,
            "running": running,
            "compensate": compensate,
        },
    ).all()
    return Stopping(
        [r.id for r in rows if not r.compensating],
        [QueuedAttempt(r.id, r.attempt, r.priority) for r in rows if r.compensating],
    )


def lift_stops(
    conn: sa.Connection, *, run_id: str | None, agent: str | None, by: str, reason: str | None
) -> list[StopRow]:
    """Lift every Stop standing on this run or agent, audited (`agent.stop.lifted`), in one
    statement; the gates read stops as they stand, so a lifted one refuses nothing more.
    Returns the stops lifted (none when none stood)."""
    rows = conn.execute(
        sql(
            """
            WITH l AS (
                UPDATE stops SET lifted_at = now(), lifted_by = :by
                WHERE lifted_at IS NULL
                  AND (run_id = CAST(:run_id AS uuid) OR agent = CAST(:agent AS text))
                RETURNING id, run_id, agent, reason, created_by, created_at, lifted_at,
                          lifted_by),
            a AS (
                INSERT INTO audit_events (run_id, kind, detail)
                SELECT run_id, 'agent.stop.lifted',
                       jsonb_build_object('stop_id', id, 'agent', agent,
                                          'by', CAST(:by AS text),
                                          'reason', CAST(:reason AS text),
                                          'stop_reason', reason, 'stopped_by', created_by)
                FROM l)
            SELECT * FROM l ORDER BY id
            """
        ),
        {"run_id": run_id, "agent": agent, "by": by, "reason": reason},
    ).all()
    return [StopRow(**r._mapping) for r in rows]


def agent_has_runs(conn: sa.Connection, agent: str) -> bool:
    """Whether any run was ever started for this agent (an agent a Stop may name)."""
    return bool(
        conn.execute(
            sql("SELECT EXISTS (SELECT 1 FROM runs WHERE agent = :a)"), {"a": agent}
        ).scalar_one()
    )
