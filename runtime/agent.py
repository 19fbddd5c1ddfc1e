"""The agent loop of one attempt: model step, sealed checkpoint in one statement, then calls.

A resume starts by verifying the checkpoint's seal, then takes up the calls it left, then asks
the model only for the steps after the last one written (I5).
"""

from __future__ import annotations

import time
from typing import Any, NoReturn

import structlog

from runtime import drain, faults
from runtime.calls import CallRouter, Settled
from runtime.heartbeat import RunLease
from runtime.models.base import ModelError, ModelProvider, StepAnswer, StepRequest
from runtime.sealing import SealError
from runtime.services import Services
from runtime.state import RunState
from store.checkpoints import latest_checkpoint, write_checkpoint
from store.records import insert_owned_audit
from store.rows import FencedOut, RunRow
from store.runs import deliver_to_transcript, fail_run, hand_back, store_answer

log = structlog.get_logger(__name__)

MODEL_TRIES = 3


class HandedBack(Exception):
    """The worker is shutting down: the run went back to the queue as a new attempt."""


class RunFailed(Exception):
    """The run was failed with a reason (already written); nothing more to do."""


class AgentRun:
    """Executes one attempt of one run that this process has claimed and leased."""

    def __init__(self, services: Services, run: RunRow, lease: RunLease) -> None:
        self.s = services
        self.run = run
        self.lease = lease
        self.log = log.bind(run_id=run.id, attempt=run.attempt)
        self.router = CallRouter(services, run, lease)

    def execute(self) -> str:
        """Run to an answer, a failure or a hand-back; returns how the attempt ended."""
        try:
            if self.run.status == "answered":
                self._hand_on(self._open_answer())
                return "answer_handed_on"
            return self._loop(self._load_state())
        except RunFailed:
            return "failed"
        except HandedBack:
            return "handed_back"

    def _loop(self, state: RunState) -> str:
        if state.calls:
            results, settled = self.router.route(state, resuming=True)
            state.add_results(results)
            self._audit_resume(state, settled)
        elif self.run.attempt > 1:
            self._audit_resume(state, [])
        model = self._model()
        while True:
            self._boundary(state)
            if state.step >= self.s.settings.step_limit:
                self._fail(
                    f"step limit {self.s.settings.step_limit} reached without a final "
                    "answer; raise LIYAGENT_STEP_LIMIT or fix the agent",
                    "step_limit",
                )
            answer = self._ask(model, state)
            faults.point("after_model_step")
            if answer.final:
                self._finish(answer.text or "")
                return "succeeded"
            state.take_step(answer.text, answer.calls, self.run.attempt)
            sealed = self.s.sealer.seal(self.run.id, "checkpoint", state.step, state.to_payload())
            with self.s.engine.connect() as conn:
                write_checkpoint(conn, self.run.id, self.run.attempt, state.step, sealed)
            self.log.info("run.checkpoint", step=state.step, calls=len(answer.calls))
            faults.point("after_checkpoint")
            results, _ = self.router.route(state, resuming=False)
            state.add_results(results)

    def _load_state(self) -> RunState:
        with self.s.engine.connect() as conn:
            row = latest_checkpoint(conn, self.run.id)
        if row is None:
            self._fail("it has no checkpoint to start from", "no_checkpoint")
        try:
            payload = self.s.sealer.open(self.run.id, "checkpoint", row.step, row.sealed)
            return RunState.from_payload(payload)
        except (SealError, ValueError, KeyError) as exc:
            self._fail(
                f"its checkpoint of step {row.step} does not verify ({exc}); it was not used",
                "seal_failed",
                step=row.step,
            )

    def _open_answer(self) -> str:
        assert self.run.answer is not None
        try:
            payload: dict[str, Any] = self.s.sealer.open(self.run.id, "answer", 0, self.run.answer)
        except SealError as exc:
            self._fail(
                f"its stored answer does not verify ({exc}); it was not handed on", "seal_failed"
            )
        return str(payload["text"])

    def _model(self) -> ModelProvider:
        try:
            return self.s.model_for(self.run)
        except (ModelError, ValueError) as exc:
            self._fail(f"its model cannot be used: {exc}", "model_unavailable")

    def _boundary(self, state: RunState) -> None:
        """Between steps: still ours? shutting down? (I3)"""
        self.lease.ensure()
        if drain.requested():
            with self.s.engine.connect() as conn:
                new_attempt = hand_back(conn, self.run.id, self.run.attempt, self.s.holder)
            self.s.leases.release(self.lease.token)
            self.s.publisher.publish(self.run.id, new_attempt)
            self.log.info("run.handed_back", step=state.step, new_attempt=new_attempt)
            raise HandedBack

    def _ask(self, model: ModelProvider, state: RunState) -> StepAnswer:
        request = StepRequest(
            run_id=self.run.id,
            attempt=self.run.attempt,
            step=state.step + 1,
            messages=list(state.messages),
            tools=self.s.tools.schemas(self.run.spec.get("tools")),
        )
        for attempt in range(1, MODEL_TRIES + 1):
            try:
                return model.next_step(request)
            except ModelError as exc:
                if not exc.retryable or attempt == MODEL_TRIES:
                    self._fail(
                        f"the model failed at step {request.step}: {exc}",
                        "model_error",
                        step=request.step,
                    )
                delay = exc.retry_after_s if exc.retry_after_s is not None else 2.0**attempt
                self.log.warning("model.retry", step=request.step, error=str(exc), delay_s=delay)
                time.sleep(min(delay, 30.0))  # backoff before asking again, not a state wait
                self.lease.ensure()
        raise AssertionError("unreachable")

    def _finish(self, text: str) -> None:
        sealed = self.s.sealer.seal(self.run.id, "answer", 0, {"text": text})
        with self.s.engine.connect() as conn:
            store_answer(conn, self.run.id, self.run.attempt, sealed)
        faults.point("after_answer")
        self._hand_on(text)

    def _hand_on(self, text: str) -> None:
        """Deliver the stored answer to its entry point, once (the run is then succeeded)."""
        with self.s.engine.connect() as conn:
            deliver_to_transcript(conn, self.run.id, self.run.attempt, text)
        self.log.info("run.succeeded")

    def _audit_resume(self, state: RunState, settled: list[Settled]) -> None:
        kind = (
            "agent.run.crash_resumed" if self.run.resume_reason == "lost" else "agent.run.resumed"
        )
        detail = {
            "lost_count": self.run.lost_count,
            "reason": self.run.resume_reason,
            "worker": self.s.holder,
            "calls": [s.to_json() for s in settled],
        }
        with self.s.engine.connect() as conn:
            if not insert_owned_audit(
                conn,
                run_id=self.run.id,
                attempt=self.run.attempt,
                kind=kind,
                step=state.step,
                detail=detail,
            ):
                raise FencedOut(self.run.id, self.run.attempt, "audit the resume")
        self.log.info(
            "run.resumed",
            step=state.step,
            lost_count=self.run.lost_count,
            calls=[s.settled for s in settled],
        )

    def _fail(self, reason: str, code: str, step: int | None = None) -> NoReturn:
        """Fail the run for this attempt with the reason, told and audited; never returns."""
        with self.s.engine.connect() as conn:
            done = fail_run(
                conn,
                self.run.id,
                self.run.attempt,
                reason=reason,
                audit_kind="agent.run.failed",
                detail={"code": code, "step": step, "worker": self.s.holder},
            )
        if not done:
            raise FencedOut(self.run.id, self.run.attempt, "fail the run")
        self.log.warning("run.failed", code=code, reason=reason)
        raise RunFailed(reason)
