"""The states the store writes and returns, as enums: a run's status, a marked call's status,
what it executes, how a call was settled, an approval's decision and how a lost attempt was
seen.

`StrEnum`s, so each member is the very string Postgres holds and JSON carries (no migration):
a member compares equal to its text, and a row's text converts back with `RunStatus(text)`.
"""

from __future__ import annotations

from enum import StrEnum


class RunStatus(StrEnum):
    """Where a run (`runs.status`) stands."""

    QUEUED = "queued"  # waiting for a worker to claim it (a message is, or will be, published)
    RUNNING = "running"  # an attempt owns it, under a lease
    WAITING = "waiting"  # suspended on an approval or a child run; no worker or lease held
    ANSWERED = "answered"  # its answer is stored, not yet handed on to its entry points
    SUCCEEDED = "succeeded"  # its answer is handed on: finished
    FAILED = "failed"  # failed with a reason: finished


# A run in either state has ended: no attempt will ever run it again.
FINISHED = frozenset({RunStatus.SUCCEEDED, RunStatus.FAILED})
# A run in either state is owned by an attempt, which holds (or held) its lease.
OWNED = frozenset({RunStatus.RUNNING, RunStatus.ANSWERED})


class ResumeReason(StrEnum):
    """Why a run's current attempt exists (`runs.resume_reason`; NULL for a first attempt).
    Every one of them bumps the attempt: attempt > 1 means resumed (runtime/flow/order.py)."""

    LOST = "lost"  # its attempt was lost (a death or a lapsed lease) and claimed
    HANDED_BACK = "handed_back"  # its worker handed it back at a warm shutdown
    YIELDED = "yielded"  # it yielded its slot at a step boundary to a lost run (flow order)
    STORE_FAULT = "store_fault"  # given back after a store fault (no loss charged)
    APPROVAL = "approval"  # woken: the approval it waited on was decided
    CHILD_DONE = "child_done"  # woken: the child run it waited on ended
    WAIT_OVER = "wait_over"  # woken: its timer ran out
    STOPPED = "stopped"  # a Stop handed it to an attempt that raises it (a workflow compensates)


class RunKind(StrEnum):
    """What a run executes (`runs.kind`): an agent's model loop, a workflow, or a declared job."""

    AGENT = "agent"
    WORKFLOW = "workflow"
    JOB = "job"


class MarkStatus(StrEnum):
    """Where a marked call (`call_marks.status`) stands."""

    IN_DOUBT = "in_doubt"  # marked just before it was made; it may or may not have landed
    DONE = "done"  # its outcome is recorded (sealed); a resume reuses it
    SETTLED = "settled"  # not sent again: unknown, not found by its reader, or refused
    FAILED = "failed"  # the tool raised before any request of it left: nothing was sent


class Settle(StrEnum):
    """How a call was taken up: recorded as a mark's `settlement` and in a resume's audit."""

    MAKE = "made"  # a read, or a write never marked: make it now, as on a first pass
    REUSE = "reused"  # its outcome (or an earlier settlement) is recorded: reuse it
    RESEND = "resent"  # keyed write, vendor dedupes longer than a resume: same key again
    READ_BACK = "read_back"  # a reader looks the outcome up by key (found: its outcome)
    NOT_FOUND = "not_found"  # the reader found nothing: not sent again, the model is told
    UNKNOWN = "unknown"  # not sent again; the model is told the outcome is unknown
    DENIED = "denied"  # an approval-held call a person denied: not made; the model is told
    FAILED = "failed"  # the tool raised before any request of it left: nothing was sent
    REFUSED = "refused"  # a gate refused it now: not made (again); the model is told why


class ApprovalStatus(StrEnum):
    """Where an approval request (`approvals.status`) stands."""

    PENDING = "pending"  # nobody has decided yet; the run waits
    APPROVED = "approved"  # a person approved: the call is made
    DENIED = "denied"  # a person denied: the call is not made; the model is told


class Seen(StrEnum):
    """How a lost attempt was seen, written as `seen` into the audit of its claim."""

    LEASE_LAPSED = "lease_lapsed"  # the sweeper: its lease key lapsed
    LEASE_MISSING = "lease_missing"  # the sweeper: a running attempt with no lease key at all
    CONNECTION_CLOSED = "connection_closed"  # the death watch: its process's connections closed
    POOL_CHILD_DIED = "pool_child_died"  # a worker's main process: its pool child died
    PARENT_ASKED_AGAIN = "parent_asked_again"  # a parent run found its child's holder gone
    POSTGRES_UNREACHABLE = "postgres_unreachable"  # its attempt gave the run back: store fault
    LEASE_GIVEN_UP = "lease_given_up"  # its worker, cut from Postgres alone, let its leases go
