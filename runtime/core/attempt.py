"""One attempt of one run, whatever its kind: gates, checkpoint loading, hand-back, suspend,
answer, failure. `AgentRun` and `WorkflowRun` add the loop that produces steps."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, NoReturn

import structlog

from runtime.base import drain, faults
from runtime.base.sealing import SealError, digest
from runtime.core import drift
from runtime.core.calls import CallRouter, KeyFn, Settled
from runtime.core.deps import AttemptDeps
from runtime.core.enqueue import publish_quietly
from runtime.core.entry import HandOnRefused, entry_point
from runtime.core.ledger import stored
from runtime.core.outcome import Outcome
from runtime.core.waiting import Suspend
from runtime.durable import chain
from runtime.durable.definition import RunDefinition
from runtime.durable.formats import NewerFormat
from runtime.durable.gates import run_refusal
from runtime.durable.pins import Pin
from runtime.durable.state import RunState
from runtime.fleet.heartbeat import RunLease
from runtime.fleet.leases import monotonic_ms
from runtime.models.base import Typed, Usage
from runtime.sending import http
from store.checkpoints import StepRecord, select_step_records, write_checkpoint
from store.entries import deliver
from store.gates import select_gates
from store.ledger import Note
from store.records import insert_owned_audit
from store.rows import FencedOut, GateRow, RunRow
from store.runs import fail_run, hand_back, store_answer
from store.states import ResumeReason, RunStatus
from store.usage import StepUsage
from store.waits import suspend, wake_parent

log = structlog.get_logger(__name__)


class HandedBack(Exception):
    """The run went back to the queue as a new attempt: its worker is shutting down, or it
    yielded its slot to a lost run."""


class RunFailed(Exception):
    """The run was failed with a reason (already written); nothing more to do."""


@dataclass(frozen=True)
class GatesRead:
    """Gates as one statement read them (the claim, a checkpoint, or a read of their own) and
    when: they stand for `gates_fresh_ms`. Read with the claim, a checkpoint or for calls, they
    may also serve the next step boundary (`lasting`); read by a boundary, only that one."""

    row: GateRow
    at_ms: int
    lasting: bool

    def young(self, fresh_ms: int) -> bool:
        return monotonic_ms() - self.at_ms < fresh_ms


class RunAttempt:
    """Executes one attempt of one run that this process has claimed and leased."""

    # How its calls are keyed, given the run (runtime/durable/keys.py); None: an agent's
    # tool-call keys. A workflow's and a job's steps are keyed by the run and the step.
    keys: Callable[[RunRow], KeyFn] | None = None

    def __init__(
        self,
        deps: AttemptDeps,
        run: RunRow,
        definition: RunDefinition,
        lease: RunLease,
        key_for: KeyFn | None = None,
        gates: GateRow | None = None,
        unread: NewerFormat | None = None,
    ) -> None:
        self.d = deps
        self.run = run
        # What the run is, as sealed with it and verified against its row (the executor); only
        # who it is, from its row, when newer code sealed it (`unread`): the run is handed back.
        self.definition = definition
        self.unread = unread
        # The pin this worker serves the run by (runtime/core/drift.py), once it does.
        self.pin: Pin | None = None
        self.lease = lease
        self.log = log.bind(run_id=run.id, attempt=run.attempt)
        keyed = type(self).keys
        self.router = CallRouter(
            deps, run, definition, lease, key_for or (keyed(run) if keyed is not None else None)
        )
        self.fence = self.router.fence
        # The gates the claim read, checked when the attempt starts.
        self._claimed = gates
        # The gates last read, whichever statement read them (`_take`).
        self._read: GatesRead | None = None
        # The last step this attempt found or wrote in Postgres (a final answer is its next).
        self._written = run.step
        # The usage of the model response this attempt holds while it writes the step it gave
        # (None once written): a store fault's give-back records it as unconfirmed usage if
        # the write never landed (runtime/core/executor.py), since no claim of a loss does.
        self.unwritten: Note | None = None

    def execute(self) -> Outcome:
        """Run to an answer, a failure, a wait or a hand-back; returns how the attempt ended.
        Every request the attempt makes passes its lease's send guard (`http.guarded`)."""
        try:
            with http.guarded(self.lease):
                return self._execute()
        except SealError as exc:
            # Any sealed value that does not verify (checkpoint, outcome, answer) fails the run
            # at once, audited; it is never used (I6).
            try:
                self._fail(str(exc), "seal_failed", step=self.run.step)
            except RunFailed:
                return Outcome.FAILED
        except RunFailed:
            return Outcome.FAILED
        except HandedBack:
            return Outcome.HANDED_BACK
        except Suspend as wait:
            with self.d.engine.connect() as conn:
                suspend(
                    conn,
                    self.run.id,
                    self.run.attempt,
                    wait.waiting_on,
                    self.run.step,
                    detail=wait.detail,
                )
            self.d.changes.announce(self.run.id)
            self.d.leases.release(self.lease.token, self.lease.written_step)
            self.log.info("run.waiting", waiting_on=wait.waiting_on)
            return Outcome.WAITING

    def _execute(self) -> Outcome:
        # Every start and every resume, a hand-on of a stored answer included, passes the gates
        # as they stand now before it does anything: a refusal fails the run with its reason,
        # told to its entry points, and nothing is sent (I7).
        if self._claimed is not None:
            self._take(self._claimed, lasting=True)
        else:
            self._gates()
        if self.unread is not None:
            drift.hand_back(self.d, self.run, self.unread, self._audit_owned, self._fail)
        if self.run.status == RunStatus.ANSWERED:
            text = self._open_answer()
            self._audit_resume(self.run.step, [], from_answer=True)
            self._hand_on(text)
            return Outcome.ANSWER_HANDED_ON
        # The code this worker runs must serve the run as pinned, and read every record of it,
        # or the run waits (or follows the latest, re-pinned): never continued silently on
        # other code (runtime/core/drift.py).
        self.pin = drift.serve_pin(self.d, self.run, self.definition, self._audit_owned, self._fail)
        if self.pin is not None:
            # Offered and allowed: the tools it is pinned to, so a follower re-pinned without
            # one is never offered it again by older code that still declares it; asked: the
            # model it pinned, whatever its profile's default is now.
            narrowed = self.pin.offered(self.definition.tools)
            model = self.pin.asked(self.definition.model)
            self.definition = replace(self.definition, tools=narrowed, model=model)
            self.router.narrow(self.definition)
        state = self._load_state()
        drift.served(self.d, self.run, self.pin, self._audit_owned)
        return self._loop(state)

    def _loop(self, state: RunState) -> Outcome:
        raise NotImplementedError

    def _gates(self) -> GateRow:
        """The gates as they stand now: the ones read less than `gates_fresh_ms` ago, or read
        again, fence included, in one statement (I3, I7)."""
        if self._read is not None and self._read.young(self.d.settings.timings.gates_fresh_ms):
            return self._read.row
        return self._read_gates(lasting=True)

    def _read_gates(self, lasting: bool) -> GateRow:
        with self.d.engine.connect() as conn:
            return self._take(select_gates(conn, self.run.id), lasting)

    def _take(self, gates: GateRow, lasting: bool) -> GateRow:
        """Gates just read with the run's attempt and status: a run that another attempt owns
        stops here (I3); a run-level refusal fails the run with its reason (I7)."""
        if gates.run_attempt != self.run.attempt or gates.run_status != self.run.status:
            raise FencedOut(self.run.id, self.run.attempt, "go on with the next step")
        refusal = run_refusal(gates, self.run)
        if refusal is not None:
            self._fail(refusal, "gate_refused")
        self._read = GatesRead(gates, monotonic_ms(), lasting)
        return gates

    def _resume_calls(self, state: RunState) -> bool:
        """Take up the calls the checkpoint left (through the gates as they stand now); whether
        there were any."""
        if state.calls:
            gates = self._gates()
            with self.d.tracing.step(state.step, resumed=True):
                results, settled = self.router.route(state, resuming=True, gates=gates)
            state.add_results(results)
            self._audit_resume(state.step, settled)
            return True
        if self.run.attempt > 1:
            self._audit_resume(state.step, [])
        return False

    def _load_state(self) -> RunState:
        """The run's state rebuilt from its base checkpoint (on the row the claim returned) and
        its step records (one query, none at step 0), each opened against its seal and its
        place in the chain: a chain that does not verify is never used (I6)."""
        if self.run.checkpoint is None:
            self._fail("it has no checkpoint to start from", "no_checkpoint")
        witnessed = self.lease.witnessed_step
        if witnessed > self.run.step:
            # Redis saw step `witnessed` written; Postgres now ends before it: its newest steps
            # were removed (a database writer, or a failover to a standby that lacked them).
            # Asking the model for them again would break I5; the run fails instead (I6).
            self._fail(
                f"its steps end at {self.run.step} in Postgres, but step {witnessed} was "
                "written (its step witness in Redis says so): its newest steps were removed, "
                "so it was not resumed; check who changed the database",
                "steps_rolled_back",
                step=self.run.step,
            )
        records: list[StepRecord] = []
        if self.run.step > 0:
            with self.d.engine.connect() as conn:
                records = select_step_records(conn, self.run.id)
        try:
            return chain.rebuild(self.d.sealer, self.run, records)
        except NewerFormat as exc:
            drift.hand_back(self.d, self.run, exc, self._audit_owned, self._fail)
        except (ValueError, KeyError, TypeError) as exc:
            self._fail(
                f"its checkpoint of step {self.run.step} does not verify ({exc}); it was not used",
                "seal_failed",
                step=self.run.step,
            )

    def _checkpoint(self, state: RunState, usage: Usage | None = None) -> GateRow:
        """Write the step's sealed record (what it added, chained to the last one) before any of
        its calls is made (fenced), reading the gates the calls go through in the same
        statement; returns them. A run not written ahead (TICKETIQ_CRASH_RESUME_ENTRIES=false)
        writes none (lost, it fails): its calls go through the gates as `_gates` has them. A
        step that asks more than LIYAGENT_STEP_MAX_BYTES is refused whole: the run fails. The
        `usage` its model's response reported is written with the record (store/usage.py)."""
        # Nothing of the step, its failure or (not written ahead) its calls, goes on from an
        # attempt that may have lost its lease; the checkpoint's write checks it again.
        self.lease.check()
        limit = self.d.settings.step_max_bytes
        asked = state.asked_bytes()
        if asked > limit:
            self._fail(
                f"step {state.step} asked {asked} bytes (its answer and calls), more than "
                f"LIYAGENT_STEP_MAX_BYTES={limit}; nothing of it was written or made: raise the "
                "limit or have the model answer in smaller steps",
                "step_too_large",
                step=state.step,
            )
        if not self.run.resumable:
            return self._gates()
        sealed = chain.seal_step(self.d.sealer, self.run.id, state)
        used = self._holding(state.step, usage)
        with self.fence.write() as conn:
            gates = write_checkpoint(conn, self.run.id, self.run.attempt, state.step, sealed, used)
        self.unwritten, self._written = None, state.step
        state.mark_written(digest(sealed))
        self.lease.wrote(state.step)
        # Debug only: a line per step costs a thread-pool worker a JSON encode and the log
        # handler's lock per model step; the step, its calls and bytes are in Postgres.
        self.log.debug("run.checkpoint", step=state.step, calls=len(state.calls), bytes=len(sealed))
        return self._take(gates, lasting=True)

    def _holding(self, step: int, usage: Usage | None) -> StepUsage | None:
        """The `usage` of the response that gave `step`, as the store writes it with the step;
        held as `unwritten` until the write lands (the ledger on: what it records)."""
        used = stored(usage, self.d.settings)
        if used is not None and self.d.settings.usage_ledger:
            self.unwritten = Note(
                self.run.id, self.run.attempt, step, used.input_tokens, used.output_tokens,
                used.model, used.cost_usd,
            )  # fmt: skip
        return used

    def _open_answer(self) -> str:
        """The stored answer, opened against its seal (a failure fails the run, I6)."""
        assert self.run.answer is not None
        payload: dict[str, Any] = self.d.sealer.open(self.run.id, "answer", 0, self.run.answer)
        return str(payload["text"])

    def _boundary(self, state: RunState) -> None:
        """Between steps: still ours? shutting down? still allowed? (I3, I7)"""
        structlog.contextvars.bind_contextvars(step=state.step)
        # The spans of the step just done leave now: a SIGKILL loses only the step in flight.
        self.d.tracing.flush()
        self.lease.renew()
        if drain.requested():
            self._hand_back(state.step, ResumeReason.HANDED_BACK)
        # Gates the claim, the last checkpoint or the last calls read within `gates_fresh_ms`
        # serve this boundary; otherwise (a slow step, or no statement since the last
        # boundary) they are read again. Either way the next boundary needs newer ones.
        read = self._read
        if read is not None and read.lasting and read.young(self.d.settings.timings.gates_fresh_ms):
            self._read = replace(read, lasting=False)
            gates = read.row
        else:
            gates = self._read_gates(lasting=False)
        if gates.yield_to is not None:
            # A loss's claim asked this first attempt to yield its slot, and a lost run is still
            # queued (resumed runs first, runtime/flow/order.py): handed back like a warm
            # shutdown, it is published behind that run and resumes from this boundary.
            self._hand_back(state.step, ResumeReason.YIELDED, yielded_to=gates.yield_to)

    def _hand_back(
        self, step: int, reason: ResumeReason, yielded_to: str | None = None
    ) -> NoReturn:
        """Give the run back to the queue as a new attempt at this boundary (fenced, I3),
        release its lease and publish it, so it continues elsewhere at once."""
        with self.d.engine.connect() as conn:
            new_attempt = hand_back(
                conn, self.run.id, self.run.attempt, self.d.holder, reason, yielded_to
            )
        self.d.leases.release(self.lease.token, self.lease.written_step)
        publish_quietly(self.d.changes, self.d.publisher, self.run.id, new_attempt)
        self.log.info(
            "run.handed_back",
            step=step,
            new_attempt=new_attempt,
            reason=reason,
            yielded_to=yielded_to,
        )
        raise HandedBack

    def _finish(self, text: str, output: Typed | None = None, usage: Usage | None = None) -> None:
        """Seal the final answer (with its typed value, when its agent declares an output
        type). An entry point in Postgres has it stored and delivered in one statement; one
        outside (a post to a service) has it stored first, and a resume hands that answer on,
        never running the turn again. The `usage` of the step that gave it is stored with it."""
        answer: dict[str, Any] = {"text": text}
        if output is not None:
            answer["output"] = output.value
        self._check_answer_size(answer)
        sealed = self.d.sealer.seal(self.run.id, "answer", 0, answer)
        used = self._holding(self._written + 1, usage)
        if not entry_point(self.run).outside:
            with self.fence.write() as conn:
                deliver(
                    conn,
                    self.run.id,
                    self.run.attempt,
                    text,
                    sealed_answer=sealed,
                    retention_s=self.d.settings.answer_retention_s,
                    usage=used,
                )
            self.unwritten = None
            faults.point("after_answer")
            self.log.info("run.succeeded")
            self._wake_parent()
            return
        with self.fence.write() as conn:
            store_answer(conn, self.run.id, self.run.attempt, sealed, used)
        self.unwritten = None
        faults.point("after_answer")
        self._hand_on(text)

    def _check_answer_size(self, answer: dict[str, Any]) -> None:
        """A final answer is the last thing a step adds: one larger than LIYAGENT_STEP_MAX_BYTES
        fails the run and is never stored, sealed or handed on (nor quoted in the reason)."""
        limit = self.d.settings.step_max_bytes
        size = len(json.dumps(answer, sort_keys=True, default=str).encode())
        if size > limit:
            self._fail(
                f"run {self.run.id}: its final answer was {size} bytes, more than "
                f"LIYAGENT_STEP_MAX_BYTES={limit}; it was not stored or handed on: raise the "
                "limit or have the agent answer in less",
                "answer_too_large",
            )

    def _hand_on(self, text: str) -> None:
        """Deliver the stored answer to its entry points, once (the run is then succeeded)."""
        reply = None
        self.lease.check()  # a taken-over attempt must not post or deliver (I3)
        entry = entry_point(self.run)
        if entry.outside:
            try:
                reply = entry.hand_on(self.d.hand_on, self.run, self.definition, text)
            except HandOnRefused as exc:
                # A definite refusal (4xx): posting again cannot help; the hand-on fails.
                self._fail(f"its answer could not be handed on: {exc}", "hand_on_refused")
            faults.point("after_reply")
        with self.fence.write() as conn:  # a taken-over attempt must not deliver (I3)
            deliver(
                conn,
                self.run.id,
                self.run.attempt,
                text,
                retention_s=self.d.settings.answer_retention_s,
                reply=reply,
            )
        self.log.info("run.succeeded")
        self._wake_parent()

    def _wake_parent(self) -> None:
        if self.run.parent_run_id is None:
            return
        with self.d.engine.connect() as conn:
            woke = wake_parent(conn, self.run.id)
        if woke is not None:
            publish_quietly(self.d.changes, self.d.publisher, *woke)

    def _audit_resume(self, step: int, settled: list[Settled], from_answer: bool = False) -> None:
        """Audit a resume that passed its gates: the step it started from, the loss count and
        how each call it left was settled; a hand-on says it resumed from the stored answer,
        with no calls (fenced: a taken-over attempt audits nothing, I3)."""
        kind = (
            "agent.run.crash_resumed" if self.run.resume_reason == "lost" else "agent.run.resumed"
        )
        detail = {
            "lost_count": self.run.lost_count,
            "reason": self.run.resume_reason,
            "worker": self.d.holder,
            "resumed_from": "stored_answer" if from_answer else "checkpoint",
            "calls": [s.to_json() for s in settled],
        }
        self._audit_owned(kind, step, detail)
        self.log.info(
            "run.resumed",
            step=step,
            lost_count=self.run.lost_count,
            resumed_from=detail["resumed_from"],
            calls=[s.settled for s in settled],
        )

    def _audit_owned(self, kind: str, step: int, detail: dict[str, Any]) -> None:
        """A run event this attempt writes (its resume, a wait on its model endpoint, a 429
        met), fenced: a taken-over attempt writes nothing and stops (I3)."""
        with self.d.engine.connect() as conn:
            if not insert_owned_audit(
                conn,
                run_id=self.run.id,
                attempt=self.run.attempt,
                kind=kind,
                step=step,
                detail=detail,
            ):
                raise FencedOut(self.run.id, self.run.attempt, f"audit {kind}")
        self.d.changes.announce(self.run.id)

    def _fail(self, reason: str, code: str, step: int | None = None) -> NoReturn:
        """Fail the run for this attempt with the reason, told and audited; never returns."""
        with self.d.engine.connect() as conn:
            done = fail_run(
                conn,
                self.run.id,
                self.run.attempt,
                reason=reason,
                audit_kind="agent.run.failed",
                detail={"code": code, "step": step, "worker": self.d.holder},
            )
        if not done:
            raise FencedOut(self.run.id, self.run.attempt, "fail the run")
        self.d.changes.announce(self.run.id)
        self.log.warning("run.failed", code=code, reason=reason)
        self._wake_parent()
        raise RunFailed(reason)
