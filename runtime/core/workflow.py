"""Workflow runs: a deterministic step graph on the same checkpoints, leases and sweeper.

Each step is checkpointed before its call is made. Its key comes from the workflow run id, the
step id and how many steps the run had executed: a retry sends the same key, a loop back to the
step sends a new one (I8).
"""

from __future__ import annotations

import json

from runtime.base import faults
from runtime.core.attempt import RunAttempt
from runtime.core.calls import KeyFn
from runtime.core.outcome import Outcome
from runtime.durable.keys import workflow_step_key
from runtime.durable.state import RunState, ToolCall
from runtime.durable.workflow_spec import WorkflowError, WorkflowStep, validate_workflow
from store.rows import RunRow

MAX_EXECUTED = 1000


def workflow_key(run: RunRow) -> KeyFn:
    def key_for(state: RunState, index: int, call: ToolCall) -> tuple[str, bool]:
        return workflow_step_key(run.id, call.id, state.counters.get("executed", 0)), True

    return key_for


class WorkflowRun(RunAttempt):
    """One attempt of a JSON step graph's run."""

    keys = staticmethod(workflow_key)

    def _loop(self, state: RunState) -> Outcome:
        try:
            steps = validate_workflow(self.definition.workflow)
        except WorkflowError as exc:
            self._fail(f"its workflow is malformed: {exc}", "bad_workflow")
        if not state.cursor:
            state.cursor = {"current": (self.definition.workflow or {})["start"], "loops": {}}
        if self._resume_calls(state):
            self._advance(state, steps)
        while True:
            self._boundary(state)
            current = state.cursor.get("current")
            if current is None:
                self._finish(self._summary(state))
                return Outcome.SUCCEEDED
            executed = state.count_of("executed")
            if executed >= MAX_EXECUTED:
                self._fail(f"it executed {executed} steps without ending", "step_limit")
            step = steps[current]
            state.step = executed + 1
            state.calls = [ToolCall(id=step.id, name=step.tool, args=step.args)]
            gates = self._checkpoint(state)
            faults.point("after_checkpoint")
            results, _ = self.router.route(state, resuming=False, gates=gates)
            state.add_results(results)
            self._advance(state, steps)

    def _advance(self, state: RunState, steps: dict[str, WorkflowStep]) -> None:
        """After a step's call: count it, then loop back (a fixed number of times) or go on."""
        step = steps[state.cursor["current"]]
        state.count("executed")
        loops: dict[str, int] = state.cursor.setdefault("loops", {})
        if step.loop_to is not None and loops.get(step.id, 0) < step.loop_times:
            loops[step.id] = loops.get(step.id, 0) + 1
            state.cursor["current"] = step.loop_to
        else:
            state.cursor["current"] = step.next

    def _summary(self, state: RunState) -> str:
        results = [
            {"step": m["tool_call_id"], "outcome": json.loads(m["content"])}
            for m in state.messages
            if m.get("role") == "tool"
        ]
        return json.dumps(
            {
                "workflow": self.run.agent,
                "executed": state.count_of("executed"),
                "results": results,
            },
            sort_keys=True,
        )
