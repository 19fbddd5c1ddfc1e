"""The ledger's runtime side (issue 34): what a step's usage costs, priced when the step is
written (runtime/models/prices.py, the deployment's table at that moment: a step keeps the cost
it was written with), and what an attempt notes in Redis before each model step so the claim of
its loss can record what the lost request may have been billed (runtime/fleet/usage_notes.py,
store/ledger.py). LIYAGENT_USAGE_LEDGER=false turns both off; tokens are still written with
their step.

The reservation is an upper bound of what the provider bills for the request, so unconfirmed
usage covers it:

- input: the bytes of everything sent that the request's prompt is made of (its messages, its
  tool schemas, its pinned instructions, what its provider adds each time: `prompt_fixed`;
  a framework agent's run stored before pins is sent its code's instructions uncounted),
  JSON-encoded, plus an allowance per message and per tool for the provider's framing. A
  byte-level BPE tokenizer (OpenAI's, Anthropic's) never makes more tokens than bytes, and the
  simulator's tokenizer (simulators/token_limit.py `prompt_tokens`: a word or a run of marks
  a token, 3 a message and 3 the reply) counts fewer tokens than characters;
- output: the request's max_tokens (the run's spec, its profile's, else DEFAULT_OUTPUT_TOKENS):
  the most a provider generates when it is sent. An OpenAI-compatible request sends it only
  when the run or profile names one; without, the default is an estimate, not a bound.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from runtime.base.settings import Settings
from runtime.base.tracing import Tracing
from runtime.core.deps import AttemptDeps
from runtime.fleet import usage_notes
from runtime.flow.limits import DEFAULT_OUTPUT_TOKENS
from runtime.models import prices
from runtime.models.base import ModelProvider, StepRequest, Usage
from runtime.models.profiles import ModelProfile
from store.ledger import Note
from store.usage import StepUsage

# Tokens a provider's chat template adds per message (OpenAI's cookbook counts 3 or 4, the
# simulator 3) and per request (the reply's priming), with room to spare.
PER_MESSAGE = 8
PER_REQUEST = 64
# Tokens a provider's rendering of one tool's schema may add beyond its JSON (names, framing).
PER_TOOL = 32


def stored(usage: Usage | None, settings: Settings) -> StepUsage | None:
    """A response's usage as the store writes it with its step, priced by the deployment's
    table (LIYAGENT_MODEL_PRICES): cost None for a model no entry prices, or the ledger off."""
    if usage is None:
        return None
    cost = None
    if settings.usage_ledger:
        cost = prices.parse(settings.model_prices).cost_usd(
            usage.model, usage.input_tokens, usage.output_tokens, usage.cached_tokens
        )
    return StepUsage(
        usage.input_tokens, usage.output_tokens, usage.cached_tokens, usage.model, cost
    )


def input_bound(messages: Sequence[Any], tools: Sequence[Any], fixed: Sequence[Any] = ()) -> int:
    """An upper bound of a request's prompt tokens (see the module's note)."""
    sent = json.dumps([list(messages), list(tools), list(fixed)], default=str).encode()
    return len(sent) + PER_MESSAGE * len(messages) + PER_TOOL * len(tools) + PER_REQUEST


def output_bound(spec: dict[str, Any], profile: ModelProfile | None) -> int:
    """The most tokens the request may generate: its max_tokens (the run's, its profile's,
    else the default the limits use too)."""
    asked = spec.get("max_tokens")
    if isinstance(asked, int) and not isinstance(asked, bool) and asked > 0:
        return asked
    if profile is not None and profile.max_tokens is not None:
        return profile.max_tokens
    return DEFAULT_OUTPUT_TOKENS


def asked_model(spec: dict[str, Any], profile: ModelProfile | None, model: Any) -> str | None:
    """The model a request asks for: the run's spec's, its profile's, or its provider's own
    (a framework agent's `model_name`); None when none names it (its cost is then unknown)."""
    named = spec.get("model")
    if isinstance(named, str) and named:
        return named
    if profile is not None and profile.model:
        return profile.model
    own = getattr(model, "model_name", None)
    return own if isinstance(own, str) and own else None


def bound(
    deps: AttemptDeps,
    request: StepRequest,
    model: ModelProvider,
    spec: dict[str, Any],
    profile_name: str | None,
) -> tuple[int, int]:
    """The most `request` may be billed, input and output tokens (the module's note): what
    its note reserves, and what a budget reserves for it (runtime/core/budget_gate.py)."""
    profile = deps.model_profiles().get(profile_name or "")
    fixed = [*getattr(model, "prompt_fixed", ()), request.instructions]
    inputs = input_bound(request.messages, request.tools, fixed)
    return inputs, output_bound(spec, profile)


def reserve(
    deps: AttemptDeps, request: StepRequest, model_name: str | None, limit: tuple[int, int]
) -> None:
    """Note in Redis what `request` may be billed (`limit`: its `bound`, input and output
    tokens, asking `model_name`), before it is asked (one SET; nothing when the ledger is off):
    what the claim of this attempt's loss records as unconfirmed usage if the step is never
    written."""
    if not deps.settings.usage_ledger:
        return
    inputs, outputs = limit
    cost = prices.parse(deps.settings.model_prices).cost_usd(model_name, inputs, outputs)
    reserved = Note(
        request.run_id, request.attempt, request.step, inputs, outputs, model_name, cost
    )
    usage_notes.note(deps.redis, deps.settings.namespace, reserved)


def traced(tracing: Tracing, usage: Usage | None) -> None:
    """A response's usage on its model request's span (the GenAI attributes; none reported,
    none set)."""
    if usage is not None:
        tracing.model_usage(usage.input_tokens, usage.output_tokens, usage.model)
