"""Checkpoint and call-mark statements, each fenced on the writing attempt (I3)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa

from store.db import sql
from store.gates import gate_row, gates_of
from store.rows import FencedOut, GateRow, MarkRow
from store.runs import OWNER_CTE
from store.states import MarkStatus, Settle
from store.usage import StepUsage, usage_params

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
    conn: sa.Connection,
    run_id: str,
    attempt: int,
    step: int,
    sealed: bytes,
    usage: StepUsage | None = None,
) -> GateRow:
    """Write step `step`'s sealed record (what the step added, with the `usage` its model's
    response reported) and advance the run's step counter, in one statement that matches only
    while this attempt owns the run (I3) and only for the step after the one written last: a
    step is written once (I5), so its usage is counted once, and only a written step's. The
    record is inserted only if the run's row matched. The same statement reads the run's gates
    as they stand now, for the step's calls (I7)."""
    row = conn.execute(
        sql(
            f"""
            WITH w AS (
                UPDATE runs SET step = :step,
                       checkpoint_attempt = :attempt, checkpointed_at = now(),
                       updated_at = now()
                WHERE id = :run_id AND attempt = :attempt AND status = 'running'
                  AND step = :step - 1
                RETURNING id, agent, owner, run_as, channel, attempt, status, yield_for, step,
                          on_stop),
            rec AS (
                INSERT INTO run_steps (run_id, step, attempt, sealed, input_tokens,
                                       output_tokens, cached_tokens, model, cost_usd)
                SELECT id, :step, :attempt, :sealed, :input_tokens,
                       :output_tokens, :cached_tokens, :model, :cost_usd FROM w)
            {gates_of("w")}
            """
        ),
        {
            "run_id": run_id,
            "attempt": attempt,
            "step": step,
            "sealed": sealed,
            **usage_params(usage),
        },
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
    resume sending a keyed write again) keeps its first kind and key (I7), and its first
    attempt and time (its run event's place, store/events.py)."""
    row = conn.execute(
        sql(
            f"""
            WITH {OWNER_CTE}
            INSERT INTO call_marks (run_id, step, call_index, call_id, tool, kind, idem_key,
                                    stable_key, status, attempt, first_attempt, first_marked_at)
            SELECT id, :step, :call_index, :call_id, :tool, :kind, :idem_key, :stable_key,
                   'in_doubt', :attempt, :attempt, now()
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
    return _mark(row)


def _mark(row: sa.Row[Any]) -> MarkRow:
    how = row.settlement
    return MarkRow(
        **{
            **row._mapping,
            "status": MarkStatus(row.status),
            "settlement": None if how is None else Settle(how),
        }
    )


# How finishing a mark is audited: a settlement and a failure are; a recorded result is not.
_FINISH_AUDIT = {MarkStatus.SETTLED: "agent.call.settled", MarkStatus.FAILED: "agent.call.failed"}


def finish_mark(
    conn: sa.Connection,
    *,
    run_id: str,
    attempt: int,
    step: int,
    call_index: int,
    status: MarkStatus,
    sealed_outcome: bytes | None,
    settlement: str | None,
) -> None:
    """Finish a mark in doubt in one statement, fenced on the owner (I3), audited in the same
    statement unless `done`: `done`, its result recorded for a resume to reuse instead of
    settling it; `settled`, not sent again (unknown, not found by its reader, refused by a
    gate); `failed`, it raised before any request of it left (nothing was sent).
    `sealed_outcome` is what the model was told (None: told by its settlement). Only a mark
    still in doubt moves: a call is finished once (I2)."""
    if status is MarkStatus.IN_DOUBT:
        raise ValueError("a mark is finished as done, settled or failed, not in doubt")
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
                  AND call_marks.call_index = :call_index AND call_marks.status = 'in_doubt'
                RETURNING call_marks.run_id, call_marks.step, call_marks.call_index,
                          call_marks.call_id, call_marks.tool, call_marks.kind,
                          call_marks.settlement),
            a AS (
                INSERT INTO audit_events (run_id, kind, attempt, step, detail)
                SELECT run_id, :audit_kind, :attempt, step,
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
            "status": status.value,
            "outcome": sealed_outcome,
            "settlement": settlement,
            "audit": status in _FINISH_AUDIT,
            "audit_kind": _FINISH_AUDIT.get(status),
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
    return [_mark(r) for r in rows]


def marks_by_index(marks: list[MarkRow]) -> dict[int, MarkRow]:
    return {m.call_index: m for m in marks}
