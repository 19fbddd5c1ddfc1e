"""The agent loop: model step, sealed checkpoint in one statement, then calls.

A resume starts by verifying the checkpoint's seal, then takes up the calls it left, then asks
the model only for the steps after the last one written (I5).
"""

from __future__ import annotations

import time

from runtime.base import faults
from runtime.core.attempt import RunAttempt
from runtime.core.outcome import Outcome
from runtime.durable.state import RunState
from runtime.models.base import ModelError, ModelProvider, StepAnswer, StepRequest
from runtime.models.errors import too_large
from runtime.models.output import TypedAnswers
from runtime.sending import bounded

MODEL_TRIES = 3


class AgentRun(RunAttempt):
    def _loop(self, state: RunState) -> Outcome:
        self._resume_calls(state)
        model = self._model()
        while True:
            self._boundary(state)
            if state.step >= self.d.settings.step_limit:
                self._fail(
                    f"step limit {self.d.settings.step_limit} reached without a final "
                    "answer; raise LIYAGENT_STEP_LIMIT or fix the agent",
                    "step_limit",
                )
            with self.d.tracing.step(state.step + 1):
                if self._step(model, state):
                    return Outcome.SUCCEEDED

    def _step(self, model: ModelProvider, state: RunState) -> bool:
        """One model step: ask, then the final answer (True), or the checkpoint and calls."""
        with self.d.tracing.model_request(state.step + 1):
            answer = self._ask(model, state)
        faults.point("after_model_step")
        if answer.refused is not None:
            # A final answer that does not fit the declared output type: the step is written
            # with the model told why, then the next one is asked (I5).
            state.take_refused(answer.text, answer.calls, answer.refused, self.run.attempt)
            self._checkpoint(state)
            return False
        if answer.final:
            self._finish(answer.text or "", answer.output)
            return True
        state.take_step(answer.text, answer.calls, self.run.attempt)
        gates = self._checkpoint(state)
        faults.point("after_checkpoint")
        results, _ = self.router.route(state, resuming=False, gates=gates)
        state.add_results(results)
        return False

    def _model(self) -> ModelProvider:
        """The run's provider; with the run's output type, its answers checked against it (the
        type this worker's tool modules declare for the agent when it is the one the run
        started with, else the schema sealed with the run)."""
        try:
            model = self.d.provider_for(self.definition.model, self.run.id)
        except (ModelError, ValueError) as exc:
            self._fail(f"its model cannot be used: {exc}", "model_unavailable")
        schema = self.definition.output
        if schema is None:
            return model
        return TypedAnswers(model, schema, self.d.tools.output_type(self.definition.agent))

    def _ask(self, model: ModelProvider, state: RunState) -> StepAnswer:
        request = StepRequest(
            run_id=self.run.id,
            attempt=self.run.attempt,
            step=state.step + 1,
            messages=list(state.messages),
            tools=self.d.tools.schemas(self.definition.tools),
        )
        for attempt in range(1, MODEL_TRIES + 1):
            try:
                # However the provider reads its answer (httpx, an SDK, a framework), the read
                # stops past LIYAGENT_MODEL_RESPONSE_MAX_BYTES.
                with bounded.answers_at_most(self.d.settings.model_response_max_bytes):
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
                self.lease.check()
            except Exception as exc:  # an answer cut off that its provider let through unnamed
                cut = bounded.found_in(exc)
                if cut is None:
                    raise
                self._fail(
                    f"the model failed at step {request.step}: {too_large(self.run.id, cut)}",
                    "model_error",
                    step=request.step,
                )
        raise AssertionError("unreachable")
