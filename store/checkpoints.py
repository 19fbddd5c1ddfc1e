"""Checkpoint and call-mark statements, each fenced on the writing attempt (I3)."""

from __future__ import annotations

from dataclasses import dataclass

import sqlalchemy as sa

from store.db import sql
from store.gates import gate_row, gates_of
from store.rows import FencedOut, GateRow, MarkRow
from store.runs import OWNER_CTE

_MARK_COLUMNS = (
    "run_id, step, call_index, call_id, tool, kind, idem_key, stable_key, status, outcome, "
    "settlement, attempt, marked_at, settled_at"
)


@dataclass(frozen=True)
class StepRecord:
    """One sealed step record of a run, as stored."""

    step: int
    sealed: bytes


def write_checkpoint(
    conn: sa.Connection, run_id: str, attempt: int, step: int, sealed: bytes
) -> GateRow:
    """Write step `step`'s sealed record (what the step added) and advance the run's step
    counter, in one statement that matches only while this attempt owns the run (I3) and only
    for the step after the one written last: a step is written once (I5). The record is
    inserted only if the run's row matched. The same statement reads the run's gates as they
    stand now, for the step's calls (I7)."""
    row = conn.execute(
        sql(
            f"""
            WITH w AS (
                UPDATE runs SET step = :step,
                       checkpoint_attempt = :attempt, checkpointed_at = now(),
                       updated_at = now()
                WHERE id = :run_id AND attempt = :attempt AND status = 'running'
                  AND step = :step - 1
                RETURNING id, agent, owner, run_as, channel, attempt, status),
            rec AS (
                INSERT INTO run_steps (run_id, step, attempt, sealed)
                SELECT id, :step, :attempt, :sealed FROM w)
            {gates_of("w")}
            """
        ),
        {"run_id": run_id, "attempt": attempt, "step": step, "sealed": sealed},
    ).first()
    if row is None:
        raise FencedOut(run_id, attempt, f"write the checkpoint of step {step}")
    return gate_row(row)


def select_step_records(conn: sa.Connection, run_id: str) -> list[StepRecord]:
    """Every step record of the run, in step order: the chain a resume verifies and rebuilds
    the state from (one query)."""
    rows = conn.execute(
        sql("SELECT step, sealed FROM run_steps WHERE run_id = :id ORDER BY step"),
        {"id": run_id},
    ).all()
    return [StepRecord(int(r.step), bytes(r.sealed)) for r in rows]


def mark_in_doubt(
    conn: sa.Connection,
    *,
    run_id: str,
    attempt: int,
    step: int,
    call_index: int,
    call_id: str,
    tool: str,
    kind: str,
    idem_key: str,
    stable_key: bool,
) -> MarkRow:
    """Mark a changing call in doubt just before it is made (fenced, I3). Marking it again (a
    resume sending a keyed write again) keeps its first kind and key (I7)."""
    row = conn.execute(
        sql(
            f"""
            WITH {OWNER_CTE}
            INSERT INTO call_marks (run_id, step, call_index, call_id, tool, kind, idem_key,
                                    stable_key, status, attempt)
            SELECT id, :step, :call_index, :call_id, :tool, :kind, :idem_key, :stable_key,
                   'in_doubt', :attempt
            FROM owner
            ON CONFLICT (run_id, step, call_index) DO UPDATE
                SET attempt = excluded.attempt, marked_at = now()
                WHERE call_marks.status = 'in_doubt'
            RETURNING {_MARK_COLUMNS}
            """
        ),
        {
            "run_id": run_id,
            "attempt": attempt,
            "step": step,
            "call_index": call_index,
            "call_id": call_id,
            "tool": tool,
            "kind": kind,
            "idem_key": idem_key,
            "stable_key": stable_key,
        },
    ).first()
    if row is None:
        raise FencedOut(run_id, attempt, f"mark call {call_id} of step {step} in doubt")
    return MarkRow(**row._mapping)


def record_outcome(
    conn: sa.Connection,
    *,
    run_id: str,
    attempt: int,
    step: int,
    call_index: int,
    sealed_outcome: bytes,
    settlement: str | None = None,
) -> None:
    """Record a marked call's result so a resume reuses it instead of settling it (fenced)."""
    _finish_mark(conn, run_id, attempt, step, call_index, "done", sealed_outcome, settlement)


def settle_mark(
    conn: sa.Connection,
    *,
    run_id: str,
    attempt: int,
    step: int,
    call_index: int,
    settlement: str,
) -> None:
    """Record that an in-doubt call was settled without an outcome (unknown, not found by its
    reader, or refused by a gate) and was not sent again, audited in the same statement
    (fenced, I2)."""
    _finish_mark(conn, run_id, attempt, step, call_index, "settled", None, settlement, audit=True)


def _finish_mark(
    conn: sa.Connection,
    run_id: str,
    attempt: int,
    step: int,
    call_index: int,
    status: str,
    outcome: bytes | None,
    settlement: str | None,
    audit: bool = False,
) -> None:
    row = conn.execute(
        sql(
            f"""
            WITH {OWNER_CTE},
            u AS (
                UPDATE call_marks SET status = :status, outcome = :outcome, attempt = :attempt,
                       settlement = coalesce(:settlement, call_marks.settlement),
                       settled_at = now()
                FROM owner
                WHERE call_marks.run_id = owner.id AND call_marks.step = :step
                  AND call_marks.call_index = :call_index
                RETURNING call_marks.run_id, call_marks.step, call_marks.call_index,
                          call_marks.call_id, call_marks.tool, call_marks.kind,
                          call_marks.settlement),
            a AS (
                INSERT INTO audit_events (run_id, kind, attempt, step, detail)
                SELECT run_id, 'agent.call.settled', :attempt, step,
                       jsonb_build_object('call_index', call_index, 'call_id', call_id,
                                          'tool', tool, 'kind', kind, 'settlement', settlement)
                FROM u WHERE :audit)
            SELECT run_id FROM u
            """
        ),
        {
            "run_id": run_id,
            "attempt": attempt,
            "step": step,
            "call_index": call_index,
            "status": status,
            "outcome": outcome,
            "settlement": settlement,
            "audit": audit,
        },
    ).first()
    if row is None:
        raise FencedOut(run_id, attempt, f"record the outcome of call {call_index} of step {step}")


def select_marks(conn: sa.Connection, run_id: str, step: int | None = None) -> list[MarkRow]:
    """The marks of one step (or all), with each mark's age by the database clock."""
    where = "run_id = :id" + ("" if step is None else " AND step = :step")
    rows = conn.execute(
        sql(
            f"SELECT {_MARK_COLUMNS}, "
            "extract(epoch FROM now() - marked_at)::float8 AS age_s "
            f"FROM call_marks WHERE {where} ORDER BY step, call_index"
        ),
        {"id": run_id, "step": step},
    ).all()
    return [MarkRow(**r._mapping) for r in rows]


def marks_by_index(marks: list[MarkRow]) -> dict[int, MarkRow]:
    return {m.call_index: m for m in marks}
