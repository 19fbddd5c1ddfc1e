"""The agent loop: model step, sealed checkpoint in one statement, then calls.

A resume starts by verifying the checkpoint's seal, then takes up the calls it left, then asks
the model only for the steps after the last one written (I5).
"""

from __future__ import annotations

import json
import time
from dataclasses import replace
from functools import cached_property

from runtime.base import faults
from runtime.core import ledger
from runtime.core.attempt import RunAttempt
from runtime.core.budget_gate import BudgetGate
from runtime.core.model_gate import EndpointWait
from runtime.core.outcome import Outcome
from runtime.durable.state import RunState
from runtime.flow.limits import DEFAULT_OUTPUT_TOKENS, MODEL_TIMEOUT_MS, input_estimate
from runtime.models import prices
from runtime.models.base import ModelError, ModelProvider, StepAnswer, StepRequest
from runtime.models.errors import too_large
from runtime.models.output import TypedAnswers
from runtime.models.profiles import ModelProfile
from runtime.sending import bounded
from store.signals import take_agent_signals
from store.states import ResumeReason

MODEL_TRIES = 3


class AgentRun(RunAttempt):
    # This attempt's budgets, made at its first model request (`_budget_for`).
    _budget: BudgetGate | None = None

    def _loop(self, state: RunState) -> Outcome:
        self._resume_calls(state)
        model = self._model()
        while True:
            self._boundary(state)
            self._take_signals(state)
            if state.step >= self.d.settings.step_limit:
                self._fail(
                    f"step limit {self.d.settings.step_limit} reached without a final "
                    "answer; raise LIYAGENT_STEP_LIMIT or fix the agent",
                    "step_limit",
                )
            with self.d.tracing.step(state.step + 1):
                if self._step(model, state):
                    return Outcome.SUCCEEDED

    def _take_signals(self, state: RunState) -> None:
        """Signals sent to the run (`client().signal`) since its last step: told to the model
        as user messages, written with the next step (taken fenced, I3; once, store/signals.py).
        Read only when the gates say one waits: a step without pays nothing."""
        read = self._read
        if read is None or not read.row.signals_waiting:
            return
        with self.fence.write() as conn:
            taken = take_agent_signals(conn, self.run.id, self.run.attempt, state.step)
        for signal in taken:
            payload = json.dumps(signal["payload"], sort_keys=True)
            state.messages.append(
                {"role": "user", "content": f"Signal {signal['name']}: {payload}", "signal": True}
            )
        self.log.info("run.signals_taken", step=state.step, signals=[s["id"] for s in taken])

    def _step(self, model: ModelProvider, state: RunState) -> bool:
        """One model step: ask, then the final answer (True), or the checkpoint and calls."""
        with self.d.tracing.model_request(state.step + 1):
            answer = self._ask(model, state)
            ledger.traced(self.d.tracing, answer.usage)
        faults.point("after_model_step")
        if answer.refused is not None:
            # A final answer that does not fit the declared output type: the step is written
            # with the model told why, then the next one is asked (I5).
            state.take_refused(answer.text, answer.calls, answer.refused, self.run.attempt)
            self._checkpoint(state, answer.usage)
            return False
        if answer.final:
            self._finish(answer.text or "", answer.output, answer.usage)
            return True
        state.take_step(answer.text, answer.calls, self.run.attempt)
        # The step's usage is written with it, in the same statement (store/usage.py).
        gates = self._checkpoint(state, answer.usage)
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

    def _pinned(self, request: StepRequest) -> StepRequest:
        """The request asked with the instructions the run's pin holds (runtime/durable/
        pins.py), whatever this code says now: a framework agent's provider sends them with
        it; a native agent's are its system prompt (the same text, unless it follows the
        latest and was re-pinned to a new one)."""
        said = None if self.pin is None else self.pin.instructions
        if said is None:
            return request
        if said.per_request:
            return replace(request, instructions=said.text)
        first = request.messages[0] if request.messages else None
        if first is not None and first.get("role") == "system":
            request.messages[0] = {**first, "content": said.text}
        return request

    def _ask(self, model: ModelProvider, state: RunState) -> StepAnswer:
        request = self._pinned(
            StepRequest(
                run_id=self.run.id,
                attempt=self.run.attempt,
                step=state.step + 1,
                messages=list(state.messages),
                tools=self.d.tools.schemas(self.definition.tools),
            )
        )
        gate = self._endpoint_wait
        estimates = self._estimates(request)
        spec = self.definition.model
        budget = self._budget_for(model)
        # What the step may be billed, reckoned once: the ledger's note holds it, and a budget
        # reserves the same (an upper bound, so a run's spend passes its budget by at most one
        # request's reservation).
        wanted = budget.applies or self.d.settings.usage_ledger
        bound = ledger.bound(self.d, request, model, spec, gate.profile) if wanted else (0, 0)
        failures = 0
        while True:
            # The run's budgets: its bound reserved, or the run suspended on the one exhausted
            # (runtime/core/budget_gate.py).
            reserved = budget.before(request.step, *bound)
            admitted = answer = None
            sent = billed = False
            try:
                # The endpoint's gate and limits, shared by the fleet: open and within them, or
                # waited for (runtime/flow/).
                admitted = gate.before_request(request.step, *estimates)
                # What the step may be billed, noted as it is sent (not while it waits for its
                # budget or endpoint): the claim of a loss records it as unconfirmed usage if
                # the step is never written (runtime/core/ledger.py).
                ledger.reserve(self.d, request, budget.model, bound)
                sent = True
                # However the provider reads its answer (httpx, an SDK, a framework), the read
                # stops past LIYAGENT_MODEL_RESPONSE_MAX_BYTES.
                with bounded.answers_at_most(self.d.settings.model_response_max_bytes):
                    answer = model.next_step(request)
                    billed = True  # answered: its usage, or (none reported) its bound, is spent
                    return answer
            except ModelError as exc:
                if exc.rate_limited:
                    # A 429 closes the endpoint for the fleet; the step is asked again when it
                    # opens, never counted as a failure.
                    gate.met_429(exc, request.step)
                    continue
                billed = sent  # it may have been billed: its bound stays spent
                failures += 1
                if not exc.retryable or failures == MODEL_TRIES:
                    self._fail(
                        f"the model failed at step {request.step}: {exc}",
                        "model_error",
                        step=request.step,
                    )
                delay = exc.retry_after_s if exc.retry_after_s is not None else 2.0**failures
                self.log.warning("model.retry", step=request.step, error=str(exc), delay_s=delay)
                time.sleep(min(delay, 30.0))  # backoff before asking again, not a state wait
                self.lease.check()
            except Exception as exc:  # an answer cut off that its provider let through unnamed
                cut = bounded.found_in(exc)
                if cut is None:
                    raise
                billed = sent  # generated and billed, then cut off here: its bound is spent
                self._fail(
                    f"the model failed at step {request.step}: {too_large(self.run.id, cut)}",
                    "model_error",
                    step=request.step,
                )
            finally:
                gate.after_request(admitted, None if answer is None else answer.usage)
                budget.after(reserved, None if answer is None else answer.usage, billed)

    def _estimates(self, request: StepRequest) -> tuple[int, int]:
        """A step's tokens estimated for the endpoint's limits (none without any): input the
        bytes of its messages / 4 (corrected by the response's usage), output its max_tokens
        (the run's, its profile's, a default)."""
        gate = self._endpoint_wait
        if gate.limits is None:
            return 0, 0
        asked = self.definition.model.get("max_tokens")
        profile = self.d.model_profiles().get(gate.profile or "")
        cap = profile.max_tokens if profile is not None else None
        outputs = asked if isinstance(asked, int) and asked > 0 else cap or DEFAULT_OUTPUT_TOKENS
        return input_estimate(request.messages), outputs

    def _model_timeout_ms(self, declared: ModelProfile | None) -> int:
        """How long one request may take (the spec's timeout, its profile's, the longest
        provider default): how long its in-flight entry under the endpoint's limits lives."""
        asked = self.definition.model.get("timeout_s")
        if isinstance(asked, int | float) and not isinstance(asked, bool) and asked > 0:
            return round(asked * 1000)
        if declared is not None and declared.timeout_s is not None:
            return round(declared.timeout_s * 1000)
        return MODEL_TIMEOUT_MS

    def _budget_for(self, model: ModelProvider) -> BudgetGate:
        """This attempt's requests against its run's budgets (its spend read once an attempt),
        priced at the model they ask for: the spec's, its profile's or the framework's, the
        ledger's rule (`ledger.asked_model`)."""
        if self._budget is None:
            gate = self._endpoint_wait
            profile = self.d.model_profiles().get(gate.profile or "")
            self._budget = BudgetGate(
                self.d.engine,
                self.run,
                self.run.tenant or self.run.owner,
                prices.parse(self.d.settings.model_prices),
                ledger.asked_model(self.definition.model, profile, model),
                may_wait=self.definition.may_wait,
                fail=lambda reason, code: self._fail(reason, code),
                log=self.log,
            )
        return self._budget

    @cached_property
    def _endpoint_wait(self) -> EndpointWait:
        """This attempt's steps against the gate of the endpoint its model spec resolves to
        (resolved once an attempt)."""
        try:
            profile = self.d.endpoint_of(self.definition.model)
        except (ModelError, ValueError):
            profile = None  # refused by _model already; a guest's own endpoint has no gate
        declared = self.d.model_profiles().get(profile) if profile is not None else None
        return EndpointWait(
            self.d.flow,
            profile,
            self.lease,
            may_wait=self.definition.may_wait,
            hand_back=lambda: self._hand_back(self.run.step, ResumeReason.HANDED_BACK),
            log=self.log,
            limits=None if declared is None else declared.limits,
            expiry_ms=self._model_timeout_ms(declared),
            record=self._audit_owned,
            tracing=self.d.tracing,
            tenant=self.d.settings.tenants.label(self.run.tenant or self.run.owner),
        )
