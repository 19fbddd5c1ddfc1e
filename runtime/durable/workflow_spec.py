"""Workflow definitions: deterministic step graphs, no model.

`{"start": "open", "steps": {"open": {"tool": "incident.create", "args": {...},
"next": "note"}, "note": {..., "loop": {"to": "open", "times": 1}, "next": null}}}`: each step
makes one tool call; `loop` goes back to an earlier step a fixed number of times, then `next`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from store.errors import LiyagentError


class WorkflowError(LiyagentError, ValueError):
    """The workflow definition is malformed; the message names the step and field."""


@dataclass(frozen=True)
class WorkflowStep:
    id: str
    tool: str
    args: dict[str, Any]
    next: str | None
    loop_to: str | None
    loop_times: int


def _step(step_id: str, raw: Any, ids: set[str]) -> WorkflowStep:
    if not isinstance(raw, dict):
        raise WorkflowError(f"step {step_id!r} is not an object")
    tool, args, nxt, loop = raw.get("tool"), raw.get("args", {}), raw.get("next"), raw.get("loop")
    if not isinstance(tool, str) or not tool:
        raise WorkflowError(f'step {step_id!r} needs a "tool"')
    if not isinstance(args, dict):
        raise WorkflowError(f'step {step_id!r}: "args" must be an object')
    if nxt is not None and nxt not in ids:
        raise WorkflowError(f'step {step_id!r}: "next" names no step ({nxt!r})')
    loop_to, times = None, 0
    if loop is not None:
        if not isinstance(loop, dict) or loop.get("to") not in ids:
            raise WorkflowError(f'step {step_id!r}: "loop" needs "to" naming a step')
        raw_times = loop.get("times")
        if not isinstance(raw_times, int) or not 1 <= raw_times <= 100:
            raise WorkflowError(f'step {step_id!r}: "loop.times" must be 1..100')
        loop_to, times = loop["to"], raw_times
    return WorkflowStep(step_id, tool, dict(args), nxt, loop_to, times)


def validate_workflow(raw: Any) -> dict[str, WorkflowStep]:
    """Parse and check a definition up front, so a bad one is refused before it is stored."""
    if not isinstance(raw, dict) or not isinstance(raw.get("steps"), dict) or not raw["steps"]:
        raise WorkflowError('a workflow is an object with a non-empty "steps" object')
    ids = set(raw["steps"])
    if raw.get("start") not in ids:
        raise WorkflowError('"start" must name a step')
    return {step_id: _step(step_id, body, ids) for step_id, body in raw["steps"].items()}
