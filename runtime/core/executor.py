"""What a worker does with one run message: fence it, lease the run, execute, let go.

Every delivery is fenced at its start: the message's attempt must equal Postgres's and the
lease must be free (`SET NX`); otherwise the message is stale or the run is alive elsewhere,
and it is acked and dropped (I4). The sweeper resumes a run whose lease lapses.
"""

from __future__ import annotations

from typing import Any

import redis
import sqlalchemy as sa
import structlog

from runtime.base import drain, faults
from runtime.base.changes import RunChanges
from runtime.base.redact import error_facts, frames
from runtime.base.sealing import SealError
from runtime.base.tracing import AttemptFacts
from runtime.core.attempt import RunAttempt
from runtime.core.attempts import attempt_class
from runtime.core.deps import AttemptDeps
from runtime.core.enqueue import publish_quietly
from runtime.core.outcome import Outcome
from runtime.durable.definition import RunDefinition
from runtime.durable.formats import NewerFormat
from runtime.fleet import usage_notes
from runtime.fleet.heartbeat import LeaseLost, RunLease
from runtime.fleet.leases import FENCE_HOLDER, NO_STEP, Leases, Token, monotonic_ms
from runtime.flow import tenants
from runtime.recovery import outage
from runtime.sending.http import SendRefused
from store import db
from store.ledger import Note
from store.losses import loss_seen
from store.records import insert_owned_audit, select_audit
from store.rows import Claimed, FencedOut, RunRow
from store.runs import claim_delivery, fail_run
from store.states import RunKind, RunStatus, Seen
from store.store_faults import hand_back_store_fault
from store.waits import wake_parent

log = structlog.get_logger(__name__)


class NotHandled(Exception):
    """The message could not be handled at all (Postgres or Redis unreachable before the run
    was claimed, or a stale delivery holding the lease for a moment): it must go back to its
    queue, never be acked and dropped."""


class DatabaseUnreachable(NotHandled):
    """Postgres could not be used at all when the run was to be claimed (down, refusing, its
    database missing): nothing was claimed, and the message is held until it answers."""

    def __init__(self, run_id: str, cause: BaseException) -> None:
        super().__init__(f"run {run_id}: Postgres cannot be used ({type(cause).__name__})")
        self.cause = cause


def deliver(d: AttemptDeps, run_id: str, attempt: int, reserved_by: str | None = None) -> Outcome:
    """Handle one delivery (`run_message`), waiting out a database outage with the message
    held: never acked or dropped (I1), tried again after a growing pause, the outage said once
    per interval for the whole worker. A warm shutdown during the wait raises NotHandled, so
    the message goes back to its queue."""
    worker = reserved_by or d.holder
    while True:
        try:
            return run_message(d, run_id, attempt, reserved_by)
        except DatabaseUnreachable as exc:
            pause = outage.failed(
                d.notice, worker, exc.cause, "run messages are held, none is lost"
            )
            if reserved_by is not None:
                _reserve_quietly(d.leases, reserved_by, run_id, attempt)
            if drain.wait(pause):
                raise NotHandled(
                    f"run {run_id}: the worker stops while Postgres cannot be used; the message "
                    "goes back to its queue"
                ) from None


def run_message(
    d: AttemptDeps, run_id: str, attempt: int, reserved_by: str | None = None
) -> Outcome:
    """Handle one delivery of the message for (run, attempt); returns how it ended.

    The lease first (one Redis round trip: a run alive elsewhere is left alone without touching
    Postgres; the message's reservation by `reserved_by`, the worker process that received it,
    becomes the lease), then the claim, which counts the delivery in the same statement (I4)."""
    # Every log line of this delivery carries the run, the attempt and (once known) the step.
    with structlog.contextvars.bound_contextvars(run_id=run_id, attempt=attempt, step=None):
        token = Token(run_id, attempt, d.holder)
        d.presence.start()  # leases are trusted only once this process is seen to be alive
        faults.point("before_lease")
        started = monotonic_ms()
        try:
            acquired = d.leases.acquire(token, reserved_by)
            if acquired is None:
                if _held_by_older_attempt(d.leases, token):
                    # A stale delivery of an earlier attempt holds the lease for the few
                    # milliseconds its fence takes (it is never claimed by a running attempt:
                    # a claim needs the old lease gone), or a claimer's fence does while its
                    # claim runs. This message may be the run's current one: back to the
                    # queue, never dropped (I1).
                    raise NotHandled(
                        f"run {run_id}: a stale delivery of an earlier attempt holds the lease "
                        "for a moment; this message is delivered again"
                    )
                log.info("message.lease_taken")
                return Outcome.LEASE_TAKEN
        except redis.RedisError as exc:
            raise NotHandled(f"run {run_id}: {type(exc).__name__}: {exc}") from exc
        faults.point("after_lease")
        try:
            with d.engine.connect() as conn:
                claimed = claim_delivery(conn, run_id, attempt, d.holder)
        except sa.exc.SQLAlchemyError as exc:
            _release_quietly(d.leases, token)
            if db.unreachable(exc):
                raise DatabaseUnreachable(run_id, exc) from exc
            raise NotHandled(f"run {run_id}: {type(exc).__name__}") from exc
        outage.answered(d.notice, reserved_by or d.holder)
        if claimed is None:
            log.info("message.stale")
            _release_quietly(d.leases, token)
            return Outcome.STALE
        d.changes.announce(run_id)
        if claimed.run.deliveries > d.settings.timings.delivery_limit:
            return _poison(d, claimed.run, token)
        lease = d.heartbeat.hold(token, started, acquired.witnessed_step)
        outcome = _execute(d, claimed, lease, reserved_by or d.holder)
        if outcome in FREES_ROOM:
            _admit_quietly(d, claimed.run.tenant)
        return outcome


def _held_by_older_attempt(leases: Leases, token: Token) -> bool:
    """Whether the run's lease is held by an earlier attempt than this message's, or by a
    claimer's fence (held for the moment its claim takes: `Leases.fence_missing`, `take_dead`;
    the message may still be the run's current one), or was let go between the failed acquire
    and this look (only the failure path pays this round trip)."""
    held = leases.holder(token.run_id)
    if held is None:
        return True
    try:
        holding = Token.parse(held)
    except ValueError:
        return False
    return holding.attempt < token.attempt or holding.holder == FENCE_HOLDER


def _poison(d: AttemptDeps, row: RunRow, token: Token) -> Outcome:
    failed = _fail_and_tell(
        d,
        row,
        f"its message was delivered {row.deliveries} times and its worker died before "
        "starting it each time; check the workers' logs",
        {"code": "poison"},
    )
    _release_quietly(d.leases, token, ended=failed)
    return Outcome.POISON


def _fail_and_tell(d: AttemptDeps, row: RunRow, reason: str, detail: dict[str, Any]) -> bool:
    """Fail the run for this attempt, told to its entry points and audited in one fenced
    statement (I3); its waiting parent is woken and published, its followers nudged. False
    when the attempt no longer owns the run (nothing was written)."""
    with d.engine.connect() as conn:
        failed = fail_run(
            conn, row.id, row.attempt, reason=reason, audit_kind="agent.run.failed", detail=detail
        )
        woke = wake_parent(conn, row.id) if failed and row.parent_run_id else None
    d.changes.announce(row.id)
    if woke is not None:
        publish_quietly(d.changes, d.publisher, *woke)
    return failed


# How an attempt ends when its run has ended too (the run span is written then).
RUN_ENDED = frozenset({Outcome.SUCCEEDED, Outcome.FAILED, Outcome.ANSWER_HANDED_ON})
# Ends that free room in the run's tenant's bound on runs in flight (runtime/flow/tenants.py).
FREES_ROOM = RUN_ENDED | {Outcome.WAITING}


def _admit_quietly(d: AttemptDeps, tenant: str | None) -> None:
    """Admit the tenant's held runs into the room this run freed, and publish them; a failure
    is logged (the next sweep admits them)."""
    try:
        admitted = tenants.admit(d.engine, d.settings.tenants, tenant)
    except sa.exc.SQLAlchemyError as exc:
        log.warning(
            "tenant.admit_failed",
            tenant=tenant,
            error=type(exc).__name__,
            next="the next sweep admits its held runs",
        )
        return
    for run in admitted:
        publish_quietly(d.changes, d.publisher, run.run_id, run.attempt, run.priority)


def _execute(d: AttemptDeps, claimed: Claimed, lease: RunLease, worker: str) -> Outcome:
    """The attempt, on the run's definition as sealed (one that does not verify fails the run,
    I6), inside its span when traces are on (runtime/base/tracing.py); a tracing failure is
    logged and never touches the run."""
    unread = None
    try:
        definition = RunDefinition.open(d.sealer, claimed.run)
    except NewerFormat as exc:
        # Newer code sealed it: the attempt hands the run back to wait for a worker that reads
        # it (runtime/core/drift.py), knowing only who it is.
        definition, unread = RunDefinition.of_row(claimed.run), exc
    except SealError as exc:
        d.heartbeat.drop(lease)
        return _refuse_unsealed(d, claimed.run, lease.token, exc)
    except BaseException:
        d.heartbeat.drop(lease)  # not the run's fault (no key here at all): the lease lapses
        raise
    span = None
    if d.tracing.on:
        try:
            span = d.tracing.attempt(_facts(d.engine, claimed.run, definition))
        except Exception as exc:
            log.warning("traces.attempt_failed", error=type(exc).__name__)
    outcome = Outcome.ERROR
    try:
        outcome = _attempt(d, claimed, definition, lease, worker, unread)
        return outcome
    finally:
        if span is not None:
            try:
                span.end(outcome.value, outcome in RUN_ENDED)
            except Exception as exc:
                log.warning("traces.attempt_failed", error=type(exc).__name__)


def _refuse_unsealed(d: AttemptDeps, row: RunRow, token: Token, exc: SealError) -> Outcome:
    """A run whose definition does not verify is failed before anything of it is used, audited
    as a seal failure and told to its entry points (I6); its parent, if any, is woken."""
    detail = {"code": "seal_failed", "step": row.step, "worker": d.holder}
    failed = _fail_and_tell(d, row, str(exc), detail)
    log.error("run.definition_refused", run_id=row.id, reason=str(exc))
    _release_quietly(d.leases, token, ended=failed)
    return Outcome.FAILED if failed else Outcome.FENCED


def _facts(engine: sa.Engine, row: RunRow, definition: RunDefinition) -> AttemptFacts:
    """What the attempt's span is made of (read only when traces are on)."""
    lost_checkpoint = None
    if row.checkpoint_attempt == row.attempt - 1:
        lost_checkpoint = row.checkpointed_at
    lost_dead = False
    if row.resume_reason == "lost":
        with engine.connect() as conn:
            seen = loss_seen(conn, row.id, row.attempt)
        lost_dead = seen in (Seen.CONNECTION_CLOSED, Seen.POOL_CHILD_DIED)
    return AttemptFacts(
        run_id=row.id,
        agent=row.agent,
        kind=row.kind.value,
        attempt=row.attempt,
        trace=definition.trace,
        resume_reason=row.resume_reason,
        created_at=row.created_at,
        lost_at=row.queued_at,
        lost_checkpoint_at=lost_checkpoint,
        lost_dead=lost_dead,
    )


def _attempt(
    d: AttemptDeps,
    claimed: Claimed,
    definition: RunDefinition,
    lease: RunLease,
    worker: str,
    unread: NewerFormat | None = None,
) -> Outcome:
    row = claimed.run
    release = True
    outcome = Outcome.ERROR
    run: RunAttempt | None = None
    try:
        faults.point("after_claim")
        run = attempt_class(RunKind(row.kind), definition)(
            d, row, definition, lease, gates=claimed.gates, unread=unread
        )
        outcome = run.execute()
        return outcome
    except (FencedOut, LeaseLost, SendRefused) as exc:
        # A taken-over attempt writes nothing more to Postgres (I3): it is only counted. Its
        # lease is left to lapse for the sweeper to claim, unless a Stop fenced it out.
        release = isinstance(exc, FencedOut) or lease.ended_elsewhere
        log.warning("run.fenced_out", why=str(exc))
        try:  # counted for the metrics; a failure only logged
            d.redis.incr(f"{d.settings.namespace}metrics:fenced_total")
        except Exception:
            log.warning("metrics.count_failed", name="fenced_total")
        return Outcome.FENCED
    except Exception as exc:
        if outage.store_fault(exc):
            # Postgres went away under the attempt: this process lives and holds the lease,
            # so the run is not lost; it gives the run back once Postgres answers (I1).
            release = False
            held = None if run is None else run.unwritten
            return _give_back_after_store_fault(d, row, lease, worker, exc, held)
        # Unexpected (a bug): behave as a crash. Keep the lease so it lapses and the sweeper
        # resumes the run elsewhere (one a Stop fenced out goes: Postgres has moved on).
        # Its message never reaches the log or the audit: it may carry user text (item 16).
        release = lease.ended_elsewhere
        facts = error_facts(exc)
        log.error("run.error", **facts, frames=frames(exc))
        _audit_quietly(d.engine, d.changes, row, "agent.run.error", {**facts, "worker": d.holder})
        if _claim_would_fail(row, d.settings.timings.loss_limit):
            # The loss the sweeper would claim would fail the run as if its worker had died:
            # fail it here instead, with the error as the reason.
            release = _fail_after_error(d, row, facts)
            outcome = Outcome.FAILED if release else Outcome.ERROR
            return outcome
        return Outcome.ERROR
    finally:
        d.heartbeat.drop(lease)
        if release:
            cut, ended = lease.ended_elsewhere, outcome in RUN_ENDED
            _release_quietly(d.leases, lease.token, lease.written_step, ended, cut)


def _claim_would_fail(row: RunRow, loss_limit: int) -> bool:
    """Whether claiming this attempt as lost would fail the run as if its worker had died
    (`claim_lost_many`'s rule): its loss limit reached, or a run that cannot resume. A hand-on
    of a stored answer is left to that rule: its reason says the answer could not be handed on
    and is kept, which is what happened."""
    if row.status == RunStatus.ANSWERED:
        return False
    return row.lost_count + 1 > loss_limit or not row.resumable


def _fail_after_error(d: AttemptDeps, row: RunRow, facts: dict[str, Any]) -> bool:
    """Fail the run for an error that ended its attempt, with a reason that says so (its type,
    where, how often it ended an attempt, what to do), audited `error_repeated` (a run that
    cannot resume: `interrupted_by_error`), fenced: only while this attempt owns the run (I3).
    False when it could not: the lease then lapses and the sweeper claims the run as usual."""
    try:
        with d.engine.connect() as conn:
            errors = len(select_audit(conn, row.id, "agent.run.error"))
        reason = _error_reason(row, facts, max(errors, 1), d.settings.timings.loss_limit)
        code = "error_repeated" if row.resumable else "interrupted_by_error"
        detail = {"code": code, **facts, "errors": errors, "worker": d.holder}
        done = _fail_and_tell(d, row, reason, detail)
    except Exception as exc:
        log.warning("run.error_unfailed", **error_facts(exc))
        return False
    if done:
        log.warning("run.failed", code=code, error=facts["error"], errors=errors)
    return done


def _error_reason(row: RunRow, facts: dict[str, Any], errors: int, limit: int) -> str:
    """Why a run whose attempt ended in an error is failed: no worker died, so it says what
    was raised and where (never the error's message: it may carry user text)."""
    raised = f"{facts['error']}" + (f" ({facts['where']})" if facts.get("where") else "")
    todo = (
        "no worker died; the error's message is withheld (it may carry user text), its type "
        "and place are in the run's audit (agent.run.error) and the worker's log: fix its cause "
        "and start the run again"
    )
    if not row.resumable:
        return (
            f"run {row.id}: its attempt raised {raised}; it cannot resume (its kind does not, "
            f"or it was not written ahead: TICKETIQ_CRASH_RESUME_ENTRIES=false); {todo}"
        )
    if errors > row.lost_count:  # every earlier loss was an error too
        ended = "its attempt" if errors == 1 else f"each of its last {errors} attempts"
        return (
            f"run {row.id}: an error ended {ended}, more than the loss limit ({limit}, "
            f"LIYAGENT_LOSS_LIMIT) allows; the last raised {raised}; {todo}"
        )
    return (
        f"run {row.id}: lost {row.lost_count} times (limit {limit}, LIYAGENT_LOSS_LIMIT), "
        f"{row.lost_count + 1 - errors} of them without an error (a worker died or stalled), "
        f"then its attempt raised {raised}; {todo}"
    )


def _give_back_after_store_fault(
    d: AttemptDeps,
    row: RunRow,
    lease: RunLease,
    worker: str,
    fault: BaseException,
    held: Note | None = None,
) -> Outcome:
    """A store fault is not a process loss: hold the lease (the heartbeat renews it) until
    Postgres answers, then give the run back as a new attempt in one fenced statement, with
    no loss charged and audited as `agent.run.store_fault`, and publish it, so it resumes at
    once instead of after its lease. Whether the statement the fault cut short was committed
    is settled by the resume, which reads Postgres again (the step written, the answer stored,
    each mark in doubt settled per the table, I2, I5). A lease lost meanwhile (Redis gone
    too, past its deadline) leaves the run to the sweeper, which claims it the usual way.

    No claim of a loss follows, so the give-back itself records what the attempt may have
    been billed for a step it never wrote (`_unconfirmed`: `held`, the usage of the answer it
    holds, else its note's bound); the resume asks that step again."""
    log.warning("run.store_fault", **error_facts(fault), next="held until Postgres answers")
    try:
        outage.wait_for_database(
            d.notice,
            d.engine,
            worker,
            fault,
            "runs in flight keep their leases and wait for it",
            lease.check,
        )
        spent = _unconfirmed(d, row, held)
        with d.engine.connect() as conn:
            new_attempt = hand_back_store_fault(
                conn, row.id, row.attempt, d.holder, type(fault).__name__, spent
            )
    except LeaseLost as exc:
        log.warning("run.fenced_out", why=str(exc))
        return Outcome.FENCED
    except FencedOut as exc:  # another attempt owns the run: nothing more is written (I3)
        log.warning("run.fenced_out", why=str(exc))
        _release_quietly(d.leases, lease.token)
        return Outcome.FENCED
    except sa.exc.SQLAlchemyError as exc:  # gone again: the lease lapses, the sweeper claims
        log.warning("run.store_fault_unsettled", **error_facts(exc))
        return Outcome.ERROR
    _release_quietly(d.leases, lease.token)
    publish_quietly(d.changes, d.publisher, row.id, new_attempt)
    log.info("run.given_back", reason="store_fault", new_attempt=new_attempt)
    return Outcome.STORE_FAULT


def _unconfirmed(d: AttemptDeps, row: RunRow, held: Note | None) -> list[Note]:
    """What the attempt may have been billed for the steps it asked (the ledger on): the exact
    usage of the answer it holds unwritten (`held`), and its note in Redis for any other step
    (one round trip: its note names the step it asked last; the answer may not have come, or not
    reached the write). The give-back records those its run has not written."""
    if not d.settings.usage_ledger:
        return []
    noted = usage_notes.read(d.redis, d.settings.namespace, [(row.id, row.attempt)])
    if held is None:
        return noted
    return [held, *(n for n in noted if n.step != held.step)]


def _reserve_quietly(leases: Leases, holder: str, run_id: str, attempt: int) -> None:
    """Reserve a held message again (its lease's acquire let the reservation go), so that if
    this worker dies while it waits, the death watch publishes the run again at once."""
    try:
        leases.reserve(holder, run_id, attempt)
    except redis.RedisError:  # the sweeper still finds the run queued too long
        log.warning("reservation.failed")


def _release_quietly(
    leases: Leases, token: Token, written: int = NO_STEP, ended: bool = False, cut: bool = False
) -> None:
    """Let the lease go (the step written last, or the run ended: `Leases.release`), and the
    fence a Stop put in its place when `cut` (`Leases.cut_attempts`); a failure is logged."""
    try:
        leases.release(token, written, ended)
        if cut:
            leases.unfence([token])
    except Exception:  # the lease lapses by itself
        log.warning("lease.release_failed")


def _audit_quietly(
    engine: sa.Engine, changes: RunChanges, row: RunRow, kind: str, detail: dict[str, Any]
) -> None:
    """Record what ended an attempt for operators, only while the attempt still owns the run
    (I3): an attempt that fails after another took the run over (a thread of a paused
    process whose connection broke while it was stopped) writes nothing, it only logs. Never
    masks the original failure."""
    try:
        with engine.connect() as conn:
            owned = insert_owned_audit(
                conn,
                run_id=row.id,
                attempt=row.attempt,
                kind=kind,
                step=row.step,
                detail=detail,
            )
        if owned:
            changes.announce(row.id)
        else:
            log.info("audit.fenced_out", kind=kind)
    except Exception as exc:
        if outage.store_fault(exc):  # said once, with the counts, when Postgres answers
            outage.audit_unwritten(kind)
        else:
            log.warning("audit.write_failed", kind=kind)
