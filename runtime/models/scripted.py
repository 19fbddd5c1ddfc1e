"""A deterministic scripted model: plays a script, one entry per step.

It is the embedded default model for the demo and the CLI. A script is JSON:
`{"steps": [{"calls": [{"id": "toolu_1", "tool": "ticket.read", "args": {...}}],
"latency_ms": 50}, {"final": "done"}]}`. It runs in the worker and records nothing; the same
scripts served over HTTP by the simulators' model (OpenAI-compatible) record every request, which
is how tests prove that a written step is never asked again (I5).
"""

from __future__ import annotations

import time
from typing import Any

from runtime.durable.state import ToolCall
from runtime.models.base import ModelError, StepAnswer, StepRequest
from store.errors import LiyagentError


class ScriptError(LiyagentError, ValueError):
    """The script is malformed; the message says which step and field."""


def validate_script(script: Any) -> list[dict[str, Any]]:
    """Check a script's shape up front, so a bad one is refused at enqueue, not mid-run."""
    if not isinstance(script, dict) or not isinstance(script.get("steps"), list):
        raise ScriptError('a script is an object with a "steps" list')
    steps: list[dict[str, Any]] = script["steps"]
    if not steps:
        raise ScriptError("a script needs at least one step")
    for i, step in enumerate(steps, start=1):
        if not isinstance(step, dict):
            raise ScriptError(f"step {i} is not an object")
        calls, final = step.get("calls"), step.get("final")
        if (calls is None) == (final is None):
            raise ScriptError(f'step {i} needs exactly one of "calls" or "final"')
        if final is not None and not isinstance(final, str):
            raise ScriptError(f'step {i}: "final" must be text')
        if calls is not None:
            if not isinstance(calls, list) or not calls:
                raise ScriptError(f'step {i}: "calls" must be a non-empty list')
            for call in calls:
                if not isinstance(call, dict) or not call.get("id") or not call.get("tool"):
                    raise ScriptError(f'step {i}: each call needs "id" and "tool"')
                if not isinstance(call.get("args", {}), dict):
                    raise ScriptError(f'step {i}: "args" of {call["id"]} must be an object')
        latency = step.get("latency_ms", 0)
        if not isinstance(latency, int) or latency < 0:
            raise ScriptError(f'step {i}: "latency_ms" must be a non-negative integer')
    return steps


class ScriptedProvider:
    """Answers step n with the script's entry n; past the end it ends the run politely."""

    name = "scripted"

    def __init__(self, script: dict[str, Any]) -> None:
        self.steps = validate_script(script)

    def next_step(self, request: StepRequest) -> StepAnswer:
        if request.step < 1:
            raise ModelError(
                f"run {request.run_id}: step {request.step} is not a step", retryable=False
            )
        if request.step > len(self.steps):
            return StepAnswer(text="The script has no more steps.", calls=[])
        entry = self.steps[request.step - 1]
        latency = entry.get("latency_ms", 0)
        if latency:
            time.sleep(latency / 1000)  # simulates a model's generation time, not a wait on state
        if "final" in entry:
            return StepAnswer(text=entry["final"], calls=[])
        calls = [
            ToolCall(id=str(c["id"]), name=str(c["tool"]), args=dict(c.get("args") or {}))
            for c in entry["calls"]
        ]
        return StepAnswer(text=entry.get("text"), calls=calls)
