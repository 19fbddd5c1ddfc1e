"""Rows returned by the store, as frozen dataclasses, and the store's typed errors."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from typing import Any, NamedTuple, NewType

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


class QueuedAttempt(NamedTuple):
    """One attempt of a run to publish (its message): a first attempt is served by its run's
    priority (1 low, 2 normal, 3 high); a resumed one first, whatever its run's priority, and
    so is one `redelivered` (its message was taken off the queue by a worker that died before
    running it: it had reached the head of the queue, and goes back there)."""

    run_id: str
    attempt: int
    priority: int = 2
    redelivered: bool = False


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
    # The lost run this attempt was asked to yield its slot to (store/losses.py), if any.
    yield_for: str | None = None
    # Whose share of the fleet it takes, and its priority (1 low, 2 normal, 3 high).
    tenant: str | None = None
    priority: int = 2
    # The usage of the model step that gave its final answer (store/usage.py), if reported.
    answer_input_tokens: int | None = None
    answer_output_tokens: int | None = None
    answer_cached_tokens: int | None = None
    answer_model: str | None = None
    # What it cost at the prices in force when written (None: unpriced, or none reported).
    answer_cost_usd: Decimal | None = None
    # What it may spend (store/budgets.py): tokens, US dollars; None: no bound.
    budget_tokens: int | None = None
    budget_usd: Decimal | None = None
    # What of the code it was started against, sealed (runtime/durable/pins.py; None: stored
    # before pins, or erased), and since when it waits for a worker that serves it.
    pin: bytes | None = None
    drift_since: datetime | None = None
    # What a Stop does to it (`compensate`, `compensating`: a workflow that catches a Stop).
    on_stop: str | None = None


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
    # The run a loss's claim asked this attempt to yield its slot to, while that run is still
    # queued (a free slot that took it first leaves nobody to yield): None otherwise.
    yield_to: str | None = None
    # A signal sent to the run that its agent's next step has not been told yet (untaken, or
    # taken at the step the run is at by an attempt that never wrote the next one).
    signals_waiting: bool = False
    # A stopped workflow that catches a Stop (`runs.on_stop`): its Stop is raised in its
    # function (runtime/core/pyflow.py), so the stop standing does not fail it.
    compensating: bool = False


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
