"""Workflows in ordinary Python: the attempt that replays a declared `@workflow` function through
the context it works through (runtime/core/flow_context.py).

Each step is a call through the context with a name: its result is recorded, sealed and chained
like an agent's step (runtime/core/flow_steps.py), and a resume replays the function, returning
recorded results without making their steps again. Steps have the tools' kinds and the same
settlement; a step's key comes from the workflow run id, its name and its occurrence (I8).
Timers and signal waits suspend the run (no worker, no lease) until they are due.
"""

from __future__ import annotations

import asyncio
import json
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from pydantic_core import to_jsonable_python

from runtime.core.attempt import RunAttempt
from runtime.core.calls import KeyFn
from runtime.core.flow_context import AsyncWorkflowContext, WorkflowContext
from runtime.core.flow_steps import Journal
from runtime.core.outcome import Outcome as Ended
from runtime.core.waiting import Suspend
from runtime.durable.gates import stop_text
from runtime.durable.keys import flow_step_key
from runtime.durable.state import RunState, ToolCall
from runtime.toolbox.workflow_kinds import (
    WorkflowDiverged,
    WorkflowKind,
    WorkflowParamsError,
    WorkflowStopped,
)
from store.rows import GateRow, RunRow

# Steps of one async workflow that run at once (a gather's), each on a thread of its own.
CONCURRENT_STEPS = 32


def flow_key(run: RunRow) -> KeyFn:
    """Step keys from the workflow run id and the step's identity (name and occurrence)."""

    def key_for(state: RunState, index: int, call: ToolCall) -> tuple[str, bool]:
        return flow_step_key(run.id, call.id), True

    return key_for


class PyWorkflowRun(RunAttempt):
    """One attempt of a Python workflow run: replay the function through its journal."""

    keys = staticmethod(flow_key)

    # What the journal uses of the attempt.

    def write_record(self, state: RunState) -> GateRow:
        """Write the state's current step record (fenced, I3); the gates read with it."""
        return self._checkpoint(state)

    def current_gates(self) -> GateRow:
        return self._gates()

    def step_boundary(self, state: RunState, alone: bool) -> None:
        """Before a step starts: the whole boundary when no other step is in flight (a warm
        shutdown hands the run back only then); otherwise the gates as they stand now."""
        if alone:
            self._boundary(state)
        else:
            self.lease.renew()
            self._gates()

    # The attempt.

    def _loop(self, state: RunState) -> Ended:
        spec = self.definition.workflow or {}
        name = str(spec.get("python"))
        kind = self.d.tools.workflows.get(name)
        if kind is None:
            known = ", ".join(sorted(self.d.tools.workflows)) or "none"
            self._fail(
                f"workflow {name!r} is not declared on this worker (known here: {known}); load "
                "its module on every worker (LIYAGENT_TOOLS) and start it again",
                "bad_workflow",
            )
        try:
            params = kind.check(dict(spec.get("params") or {}))
        except WorkflowParamsError as exc:
            self._fail(str(exc), "bad_workflow")
        journal = Journal(self, state)
        gates = self.current_gates()
        if gates.compensating:  # stopped, and it catches a Stop: raised at its step now
            journal.stopping = stop_text(gates)
        if self.run.attempt > 1:
            self._audit_resume(state.step, [])
        value = self._replay(kind, journal, params)
        journal.settle_unmet()
        if journal.stopping is not None:
            said = json.dumps(to_jsonable_python(value, fallback=str))[:200]
            how = "its workflow compensated" if journal.stop_raised else "it had no step left"
            self._fail(f"{journal.stopping}; {how} (it returned {said})", "stopped")
        try:
            text = json.dumps(to_jsonable_python(value), sort_keys=True)
        except Exception as exc:
            self._fail(
                f"run {self.run.id}: workflow {name} returned a value that cannot be recorded "
                f"({type(exc).__name__}); return JSON values",
                "workflow_error",
            )
        state.calls = []
        self._finish(text)
        return Ended.SUCCEEDED

    def _replay(self, kind: WorkflowKind, journal: Journal, params: Any) -> Any:
        """Run the function to its end; an engine exception a step met (a wait, a fence, a
        hand-back) wins over whatever the function did with it."""
        pool: ThreadPoolExecutor | None = None
        try:
            if kind.is_async:
                pool = ThreadPoolExecutor(CONCURRENT_STEPS, f"flow-{self.run.id[:8]}")
                ctx: Any = AsyncWorkflowContext(WorkflowContext(self, journal), pool)
                value = asyncio.run(ctx.main(kind.fn, params))
            else:
                value = kind.fn(WorkflowContext(self, journal), params)
        except BaseException as exc:
            journal.quiesce()
            if journal.fatal is None and journal.stopping is not None:
                # Stopped: it ends so, whether it let the Stop through or its undoing failed.
                why = (
                    ""
                    if isinstance(exc, WorkflowStopped)
                    else (f"; its compensation raised {type(exc).__name__}: {exc}")
                )
                self._fail(f"{journal.stopping}{why}", "stopped")
            if journal.fatal is None:
                self._fail(
                    f"workflow {kind.name} raised {type(exc).__name__}: {exc}", "workflow_error"
                )
            self._raise(journal)
        finally:
            if pool is not None:
                pool.shutdown(wait=True)
        journal.quiesce()
        if journal.fatal is not None:
            self._raise(journal)
        return value

    def _raise(self, journal: Journal) -> None:
        fatal = journal.fatal
        assert fatal is not None
        if isinstance(fatal, Suspend):
            journal.record_before_wait()
        if isinstance(fatal, WorkflowDiverged):
            self._fail(str(fatal), "workflow_diverged")
        raise fatal
