"""Gate statements: what a run may do now (containment, Stop, channel, run-as, owner)."""

from __future__ import annotations

import sqlalchemy as sa

from store.rows import GateRow


def select_gates(conn: sa.Connection, run_id: str) -> GateRow:
    """Every gate of the run as it stands now, in one statement."""
    row = conn.execute(
        sa.text(
            """
            SELECT
              s.reason AS stop_reason, s.created_by AS stop_by,
              coalesce(o.may_run, true) AS owner_may_run, o.reason AS owner_reason,
              coalesce(a.may_act, true) AS run_as_may_act, a.reason AS run_as_reason,
              coalesce(c.enabled, true) AS channel_enabled, c.reason AS channel_reason,
              (SELECT array_agg(t.tool) FROM agent_tools t WHERE t.agent = r.agent) AS tools,
              r.attempt AS run_attempt, r.status AS run_status
            FROM runs r
            LEFT JOIN principals o ON o.name = r.owner
            LEFT JOIN principals a ON a.name = coalesce(r.run_as, r.owner)
            LEFT JOIN channels c ON c.name = r.channel
            LEFT JOIN LATERAL (
                SELECT reason, created_by FROM stops
                WHERE lifted_at IS NULL AND (stops.run_id = r.id OR stops.agent = r.agent)
                ORDER BY id LIMIT 1) s ON true
            WHERE r.id = :id
            """
        ),
        {"id": run_id},
    ).one()
    return GateRow(
        stop_reason=row.stop_reason,
        stop_by=row.stop_by,
        owner_may_run=row.owner_may_run,
        owner_reason=row.owner_reason,
        run_as_may_act=row.run_as_may_act,
        run_as_reason=row.run_as_reason,
        channel_enabled=row.channel_enabled,
        channel_reason=row.channel_reason,
        agent_tools=None if row.tools is None else frozenset(row.tools),
        run_attempt=row.run_attempt,
        run_status=row.run_status,
    )


def set_principal(
    conn: sa.Connection, name: str, *, may_run: bool, may_act: bool, reason: str | None
) -> None:
    conn.execute(
        sa.text(
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
        sa.text(
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
        sa.text(
            """
            WITH d AS (DELETE FROM agent_tools WHERE agent = :agent)
            INSERT INTO agent_tools (agent, tool) SELECT :agent, unnest(CAST(:tools AS text[]))
            """
        ),
        {"agent": agent, "tools": tools},
    )


def insert_stop(
    conn: sa.Connection, *, run_id: str | None, agent: str | None, reason: str, by: str
) -> list[str]:
    """Record a Stop; queued and waiting runs it covers are failed at once (running ones stop
    at their next step). Returns the ids of the runs failed here."""
    rows = conn.execute(
        sa.text(
            """
            WITH s AS (
                INSERT INTO stops (run_id, agent, reason, created_by)
                VALUES (:run_id, :agent, :reason, :by) RETURNING id),
            f AS (
                UPDATE runs SET status = 'failed', finished_at = now(), updated_at = now(),
                       failure_reason = 'stopped by ' || :by || ': ' || :reason
                WHERE status IN ('queued', 'waiting')
                  AND (id = CAST(:run_id AS uuid) OR agent = :agent)
                RETURNING id, attempt, step),
            t AS (
                INSERT INTO transcript_messages (run_id, role, content)
                SELECT id, 'notice', 'This run was stopped by ' || :by || ': ' || :reason
                FROM f),
            a AS (
                INSERT INTO audit_events (run_id, kind, attempt, step, detail)
                SELECT id, 'agent.run.stopped', attempt, step,
                       jsonb_build_object('by', :by, 'reason', :reason) FROM f)
            SELECT f.id FROM f, s
            """
        ),
        {"run_id": run_id, "agent": agent, "reason": reason, "by": by},
    ).all()
    return [r.id for r in rows]
