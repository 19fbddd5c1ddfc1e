"""A run's timeline, read from Postgres alone: its attempts (which worker held each, from when
to when, how each ended), its audited events (losses, claims, resumes, failures) and every
marked call with its settlement.

Nothing here trusts what the engine believes about itself: each fact is a row the guarded
statements wrote (the run's row, `audit_events`, `call_marks`). Reads are never marked, so a
read appears only where a resume's audit lists it. Nothing here writes.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

import sqlalchemy as sa

from store.db import sql
from store.rows import RunNotFound

LOST = "agent.run.lost"
FAILED = "agent.run.failed"
HANDED_BACK = "agent.run.handed_back"
WAITING = "agent.run.waiting"
RESUME_KINDS = ("agent.run.crash_resumed", "agent.run.resumed")

# Who claims a lost run, by the `seen` its claim writes into the loss's audit: each claimer
# passes its own (runtime/recovery/deaths.py: the death watch and a pool child's parent;
# runtime/recovery/sweeper.py: the sweeper, for a lapsed or a missing lease).
CLAIMERS = {
    "connection_closed": "the death watch",
    "pool_child_died": "its worker's main process",
    "lease_lapsed": "the sweeper",
    "lease_missing": "the sweeper",
    "parent_asked_again": "its parent run, asking its child again",
}


@dataclass(frozen=True)
class TakenUp:
    """One call a resume found in the step it resumed, and how it took it up (made, reused,
    resent, read_back, not_found, unknown, refused), from the resume's audit."""

    call_id: str
    tool: str
    kind: str
    settled: str


@dataclass(frozen=True)
class TimelineEvent:
    """One audited event of a run. `attempt` is the attempt the event is about: for a loss
    (`agent.run.lost`, or `agent.run.failed` at the loss limit) the attempt that was lost, for
    a hand-back the attempt handed back, else the attempt that wrote it."""

    at: datetime
    kind: str
    attempt: int | None
    step: int | None
    # The holder ("host-pid") it names: the lost holder, or the worker that resumed, handed
    # back, failed or erred.
    worker: str | None
    # How a loss was seen (connection_closed, pool_child_died, lease_lapsed), when recorded.
    seen: str | None
    code: str | None
    reason: str | None
    calls: tuple[TakenUp, ...] = ()
    # For a loss: when the lost attempt had been claimed.
    lost_claimed_at: datetime | None = None

    @property
    def is_loss(self) -> bool:
        """A claim of a lapsed attempt: the run was requeued (lost) or failed at the limit."""
        return self.kind == LOST or (self.kind == FAILED and self.lost_claimed_at is not None)

    @property
    def claimer(self) -> str | None:
        """Who claimed the run at a loss, as its claim recorded it (None for other events; a
        claim that names no way of seeing the loss says so rather than guessing)."""
        if not self.is_loss:
            return None
        if self.seen is None:
            return "a claim that did not record how it saw the loss"
        return CLAIMERS.get(self.seen, f"a claim that saw the loss as {self.seen!r}")

    @property
    def is_resume(self) -> bool:
        """An attempt taking the run up again after a loss, a hand-back or a wait."""
        return self.kind in RESUME_KINDS


@dataclass(frozen=True)
class TimelineCall:
    """One marked call (a call that changes something): when it was marked before sending,
    when its outcome was recorded or it was settled, and how."""

    step: int
    call_index: int
    call_id: str
    tool: str
    kind: str
    # in_doubt | done | settled | failed (store.rows.MarkStatus)
    status: str
    # resent, read_back, not_found, unknown, refused, failed; None when made on its first pass.
    settlement: str | None
    # The attempt that last wrote the mark.
    attempt: int
    marked_at: datetime
    settled_at: datetime | None

    @property
    def outcome(self) -> str:
        """How the call ended, in the resume audit's words: its settlement, `made` for a call
        whose outcome was recorded on its pass, `in_doubt` for one never settled."""
        if self.settlement:
            return self.settlement
        return "made" if self.status == "done" else "in_doubt"


@dataclass(frozen=True)
class TimelineAttempt:
    """One attempt of a run: who held it, when it was claimed, its last record, how it ended."""

    attempt: int
    # The holder ("host-pid") of the worker process; None when no record names it.
    holder: str | None
    # When a worker claimed it, as recorded (the run's row for the current attempt, the loss's
    # audit for a lost one); None when not recorded (a handed-back or woken attempt).
    claimed_at: datetime | None
    # The first and last record the attempt wrote itself (audit events and call marks).
    first_record_at: datetime | None
    last_record_at: datetime | None
    # lost, handed_back, waiting, failed, succeeded; None while it still runs (or answered).
    end: str | None
    ended_at: datetime | None

    @property
    def began_at(self) -> datetime | None:
        """When it began, as near as the records say: its claim, else its first record."""
        return self.claimed_at or self.first_record_at


@dataclass(frozen=True)
class Timeline:
    """Everything recorded about a run's life in time, ready to be drawn."""

    run_id: str
    agent: str
    kind: str
    status: str
    attempt: int
    lost_count: int
    failure_reason: str | None
    created_at: datetime
    started_at: datetime | None
    answered_at: datetime | None
    finished_at: datetime | None
    # The database clock when this was read: where a run still going is drawn up to.
    read_at: datetime
    attempts: tuple[TimelineAttempt, ...]
    events: tuple[TimelineEvent, ...]
    calls: tuple[TimelineCall, ...]

    @property
    def losses(self) -> tuple[TimelineEvent, ...]:
        """The claims of its lapsed attempts, oldest first."""
        return tuple(e for e in self.events if e.is_loss)

    @property
    def resumes(self) -> tuple[TimelineEvent, ...]:
        """Its resumes, oldest first."""
        return tuple(e for e in self.events if e.is_resume)


_RUN_SQL = """
    SELECT id AS run_id, agent, kind, status, attempt, lost_count, failure_reason, claimed_by,
           claimed_at, created_at, started_at, answered_at, finished_at,
           clock_timestamp() AS read_at
    FROM runs WHERE id = ANY(CAST(:ids AS uuid[])) ORDER BY created_at, id
"""
_AUDIT_SQL = """
    SELECT run_id, kind, attempt, step, detail, created_at FROM audit_events
    WHERE run_id = ANY(CAST(:ids AS uuid[])) ORDER BY id
"""
_MARKS_SQL = """
    SELECT run_id, step, call_index, call_id, tool, kind, status, settlement, attempt,
           marked_at, settled_at
    FROM call_marks WHERE run_id = ANY(CAST(:ids AS uuid[])) ORDER BY marked_at, step, call_index
"""


def select_timeline(conn: sa.Connection, run_id: str) -> Timeline:
    """One run's timeline; raises RunNotFound when no run has this id."""
    found = select_timelines(conn, [run_id])
    if not found:
        raise RunNotFound(run_id)
    return found[0]


def select_timelines(conn: sa.Connection, run_ids: Iterable[str]) -> list[Timeline]:
    """The timelines of these runs, oldest run first (unknown ids are skipped), in three
    reads: the runs, their audit and their call marks."""
    ids = list(dict.fromkeys(run_ids))
    if not ids:
        return []
    runs = conn.execute(sql(_RUN_SQL), {"ids": ids}).all()
    events: dict[str, list[TimelineEvent]] = {}
    for row in conn.execute(sql(_AUDIT_SQL), {"ids": ids}):
        events.setdefault(row.run_id, []).append(_event(row))
    calls: dict[str, list[TimelineCall]] = {}
    for row in conn.execute(sql(_MARKS_SQL), {"ids": ids}):
        fields = {k: v for k, v in row._mapping.items() if k != "run_id"}
        calls.setdefault(row.run_id, []).append(TimelineCall(**fields))
    out = []
    for run in runs:
        run_events = tuple(events.get(run.run_id, []))
        run_calls = tuple(calls.get(run.run_id, []))
        out.append(
            Timeline(
                **{k: v for k, v in run._mapping.items() if k not in ("claimed_by", "claimed_at")},
                attempts=_attempts(run, run_events, run_calls),
                events=run_events,
                calls=run_calls,
            )
        )
    return out


def _text(detail: dict[str, Any], key: str) -> str | None:
    value = detail.get(key)
    return None if value is None else str(value)


def _event(row: Any) -> TimelineEvent:
    """An audit row as a timeline event, its attempt being the one it is about."""
    detail: dict[str, Any] = row.detail or {}
    attempt = row.attempt
    lost_claimed_at = None
    worker = _text(detail, "worker")
    if "lost_attempt" in detail and row.kind in (LOST, FAILED):
        # Written by the loss's claim (sweeper, death watch or parent), with the run's new
        # attempt: about the lost one.
        attempt = int(detail["lost_attempt"])
        worker = _text(detail, "lost_holder")
        claimed = detail.get("lost_claimed_at")
        lost_claimed_at = datetime.fromisoformat(claimed) if claimed else None
    elif row.kind == HANDED_BACK and attempt is not None:
        attempt -= 1  # written with the new attempt the hand-back made
    calls = tuple(
        TakenUp(
            str(c.get("call_id")), str(c.get("tool")), str(c.get("kind")), str(c.get("settled"))
        )
        for c in detail.get("calls") or []
        if isinstance(c, dict)
    )
    return TimelineEvent(
        at=row.created_at,
        kind=row.kind,
        attempt=attempt,
        step=row.step,
        worker=worker,
        seen=_text(detail, "seen"),
        code=_text(detail, "code"),
        reason=_text(detail, "reason"),
        calls=calls,
        lost_claimed_at=lost_claimed_at,
    )


def _ending(n: int, events: tuple[TimelineEvent, ...]) -> tuple[str | None, TimelineEvent | None]:
    """How attempt `n` ended, by the event that ended it (None: no such event)."""
    for e in events:
        if e.attempt != n:
            continue
        if e.is_loss:
            return "lost", e
        if e.kind == HANDED_BACK:
            return "handed_back", e
        if e.kind == WAITING:
            return "waiting", e
        if e.kind == FAILED:
            return "failed", e
    return None, None


def _attempts(
    run: Any, events: tuple[TimelineEvent, ...], calls: tuple[TimelineCall, ...]
) -> tuple[TimelineAttempt, ...]:
    """Attempts 1..current, each from the records that name it; the run's `claimed_by` and
    `claimed_at` count for the current attempt only when claimed after the previous one
    ended (a loss or hand-back leaves them naming the previous holder)."""
    out: list[TimelineAttempt] = []
    previous_end: datetime | None = None
    for n in range(1, run.attempt + 1):
        end, ender = _ending(n, events)
        holder = ender.worker if ender is not None else None
        claimed_at = ender.lost_claimed_at if ender is not None else None
        current = n == run.attempt
        if (
            current
            and run.claimed_at is not None
            and (previous_end is None or run.claimed_at > previous_end)
        ):
            holder, claimed_at = run.claimed_by, run.claimed_at
        if claimed_at is None and n == 1:
            claimed_at = run.started_at
        own = [e for e in events if e.attempt == n and not e.is_loss]
        holder = holder or next((e.worker for e in own if e.worker), None)
        ended_at = ender.at if ender is not None else None
        if current and end is None and run.status in ("succeeded", "failed"):
            end, ended_at = run.status, run.finished_at
        attempt = TimelineAttempt(n, holder, claimed_at, None, None, end, ended_at)
        out.append(_with_records(attempt, own, calls, previous_end))
        previous_end = ended_at or previous_end
    return tuple(out)


def _with_records(
    a: TimelineAttempt,
    own: list[TimelineEvent],
    calls: tuple[TimelineCall, ...],
    previous_end: datetime | None,
) -> TimelineAttempt:
    """The attempt with its first and last own records: its audit events, and the call marks
    written while it held the run (between the previous attempt's end and its own)."""
    times = [e.at for e in own]
    for c in calls:
        for t in (c.marked_at, c.settled_at):
            if t is None or (previous_end is not None and t <= previous_end):
                continue
            if a.ended_at is None or t <= a.ended_at:
                times.append(t)
    if not times:
        return a
    return replace(a, first_record_at=min(times), last_record_at=max(times))
