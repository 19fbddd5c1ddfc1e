"""Rows returned by the store, as frozen dataclasses, and the store's typed errors."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any, NewType

from store.errors import LiyagentError
from store.states import ApprovalStatus, MarkStatus, RunKind, RunStatus, Settle

RunId = NewType("RunId", str)
Attempt = NewType("Attempt", int)


class StoreError(LiyagentError, RuntimeError):
    """Base of the store's typed errors."""


class FencedOut(StoreError):
    """A write matched no row: another attempt owns the run, so this one must stop (I3)."""

    def __init__(self, run_id: str, attempt: int, what: str) -> None:
        super().__init__(
            f"run {run_id}: attempt {attempt} may no longer write ({what}); another attempt "
            "owns the run, so this one stops here and writes nothing more"
        )
        self.run_id = run_id
        self.attempt = attempt


class RequestKeyConflict(StoreError):
    """A request key already names one of this caller's runs, started with other parameters:
    the same key with another request is the caller's mistake, never answered with the first
    run. It names that run (the caller's own) and nothing of the request it was started with."""

    def __init__(self, request_key: str, run_id: str, erased: bool = False) -> None:
        said = (
            "which was erased (its request is no longer known); nothing was stored - use a new "
            "key for a new request"
            if erased
            else "started with other parameters; nothing was stored - send the same request to "
            "get that run again, or use a new key for a new request"
        )
        super().__init__(f"request key {request_key!r} already names run {run_id}, {said}")
        self.request_key = request_key
        self.run_id = run_id


class RunNotFound(StoreError):
    """No run has this id."""

    def __init__(self, run_id: str) -> None:
        super().__init__(f"run {run_id} does not exist; check the id (liyagent status lists runs)")
        self.run_id = run_id


@dataclass(frozen=True)
class RunRow:
    id: RunId
    correlation_id: str
    request_key: str | None
    # SHA-256 of what identified the request under its key (None for runs without a key).
    request_digest: str | None
    agent: str
    owner: str
    # The front principal that started it (a sub-agent run: its parent's); None inside the
    # deployment (client API, cron, Teams, jobs). Scopes its request key and its readers.
    principal: str | None
    entry_kind: str
    kind: RunKind
    channel: str
    run_as: str | None
    parent_run_id: str | None
    waiting_on: str | None
    resumable: bool
    answer_expires_at: datetime | None
    answer_purged_at: datetime | None
    # Its sealed definition (runtime/durable/definition.py); None once erased.
    definition: bytes | None
    status: RunStatus
    attempt: Attempt
    lost_count: int
    deliveries: int
    step: int
    input: str
    checkpoint: bytes | None
    checkpoint_attempt: int | None
    checkpointed_at: datetime | None
    resume_reason: str | None
    claimed_by: str | None
    claimed_at: datetime | None
    failure_reason: str | None
    answer: bytes | None
    created_at: datetime
    updated_at: datetime
    queued_at: datetime | None
    started_at: datetime | None
    answered_at: datetime | None
    finished_at: datetime | None


@dataclass(frozen=True)
class StopRow:
    """An operator's Stop of one run or of an agent's runs, and who lifted it, if anyone."""

    id: int
    run_id: str | None
    agent: str | None
    reason: str
    created_by: str
    created_at: datetime
    lifted_at: datetime | None
    lifted_by: str | None


@dataclass(frozen=True)
class MarkRow:
    run_id: RunId
    step: int
    call_index: int
    call_id: str
    tool: str
    kind: str
    idem_key: str
    stable_key: bool
    status: MarkStatus
    outcome: bytes | None
    settlement: Settle | None
    attempt: int
    marked_at: datetime
    settled_at: datetime | None
    # Seconds since the mark, by the database's clock (no skew between workers).
    age_s: float = 0.0


@dataclass(frozen=True)
class ClaimResult:
    """The outcome of the sweeper's claim on a lapsed run: requeued, or failed at the limit."""

    run_id: RunId
    attempt: Attempt
    status: RunStatus
    lost_count: int
    step: int


@dataclass(frozen=True)
class AuditRow:
    id: int
    run_id: str | None
    kind: str
    attempt: int | None
    step: int | None
    detail: dict[str, Any]
    created_at: datetime


@dataclass(frozen=True)
class TranscriptRow:
    id: int
    run_id: str
    role: str
    content: str
    created_at: datetime


@dataclass(frozen=True)
class GateRow:
    """The gates of one run as they stand now, read in one statement."""

    stop_reason: str | None
    stop_by: str | None
    owner_may_run: bool
    owner_reason: str | None
    run_as_may_act: bool
    run_as_reason: str | None
    channel_enabled: bool
    channel_reason: str | None
    # Containment: the tools this agent may use; None when unrestricted.
    agent_tools: frozenset[str] | None
    # The run's attempt and status now: the fence, read with the gates in one round trip.
    run_attempt: int = 0
    run_status: RunStatus | None = None


@dataclass(frozen=True)
class Claimed:
    """A delivery's claim: the run's row, and its gates read in the claiming statement."""

    run: RunRow
    gates: GateRow


@dataclass(frozen=True)
class ApprovalRow:
    id: str
    run_id: str
    step: int
    call_index: int
    step_key: str
    tool: str
    args: dict[str, Any]
    status: ApprovalStatus
    decided_by: str | None
    reason: str | None
    created_at: datetime
    decided_at: datetime | None
