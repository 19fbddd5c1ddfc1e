"""Background jobs: a third kind of run, leased, swept and handed back like runs.

A job kind is declared like a tool (`@job`, runtime/toolbox/job_kinds.py) in the modules
`LIYAGENT_TOOLS` and `LIYAGENT_JOB_MODULES` name; the built-in ones are liyagent/jobs/. This is
the engine's part: the attempt that drives a declared job. A resumable job keeps a durable
cursor in its sealed checkpoints (fenced, like every checkpoint) and continues from it on any
worker; a job that is not resumable, lost, fails `interrupted`.
"""

from __future__ import annotations

import json
import time
from typing import Any, NoReturn

from runtime.base import faults
from runtime.core.attempt import RunAttempt
from runtime.core.outcome import Outcome
from runtime.core.waiting import Suspend
from runtime.core.workflow import workflow_key
from runtime.durable.state import RunState, ToolCall
from runtime.services import Services
from runtime.toolbox.job_kinds import JobError


class JobRun(RunAttempt):
    """The attempt that runs one declared job, handing it the `JobContext` it works through."""

    keys = staticmethod(workflow_key)
    # Outcomes of the call the checkpoint left, taken up on resume (`_loop`): the job reuses
    # them; and the state the job works on, once loaded.
    _taken_up: dict[str, dict[str, Any]]
    _state: RunState | None = None

    def _loop(self, state: RunState) -> Outcome:
        job = self.definition.job or {}
        known = self.d.tools.jobs
        kind = known.get(str(job.get("kind")))
        if kind is None:
            self._fail(
                f"unknown job kind {job.get('kind')!r} (known here: {', '.join(sorted(known))}); "
                "load its module on every worker (LIYAGENT_TOOLS) and start it again",
                "bad_job",
            )
        self._state, self._taken_up = state, {}
        left = list(state.calls)
        if self._resume_calls(state):
            for call, message in zip(left, state.messages[-len(left) :], strict=True):
                self._taken_up[call.id] = json.loads(message["content"])
            state.count("executed")
        try:
            summary = kind.run(self, kind.check(dict(job.get("params") or {}), self.d.settings))
        except JobError as exc:
            self._fail(str(exc), "job_error")
        self._finish(summary if isinstance(summary, str) else json.dumps(summary, sort_keys=True))
        return Outcome.SUCCEEDED

    # The JobContext a declared job works through (runtime/toolbox/job_kinds.py).

    @property
    def _now(self) -> RunState:
        if self._state is None:
            raise RuntimeError(f"run {self.run.id}: the job's state is read before it runs")
        return self._state

    @property
    def run_id(self) -> str:
        return self.run.id

    @property
    def attempt(self) -> int:
        return self.run.attempt

    @property
    def services(self) -> Services:
        """The process's whole assembly: public job API (`JobContext.services`), which a team's
        job kind may read anything of; the engine's own code takes `AttemptDeps`."""
        return self.d.services

    @property
    def cursor(self) -> dict[str, Any]:
        return self._now.cursor

    def count(self, name: str, n: int = 1) -> None:
        self._now.count(name, n)

    def count_of(self, name: str) -> int:
        return self._now.count_of(name)

    def boundary(self) -> None:
        self._boundary(self._now)

    def checkpoint(self) -> None:
        """Checkpoint the cursor after a unit of work (a page, a poll)."""
        state = self._now
        state.step += 1
        self._checkpoint(state)
        faults.point("after_checkpoint")

    def wait(self, seconds: float) -> NoReturn:
        raise Suspend(f"timer:{time.time() + seconds:.3f}")

    def call(self, call_id: str, tool: str, args: dict[str, Any]) -> dict[str, Any]:
        """Make one tool call through the same checkpoint-mark-send-record path as runs; a
        call the checkpoint left and the resume took up is not made again."""
        if call_id in self._taken_up:
            return self._taken_up.pop(call_id)
        state = self._now
        state.step += 1
        state.calls = [ToolCall(call_id, tool, args)]
        gates = self._checkpoint(state)
        faults.point("after_checkpoint")
        results, _ = self.router.route(state, resuming=False, gates=gates)
        state.add_results(results)
        state.count("executed")
        outcome: dict[str, Any] = json.loads(results[0]["content"])
        return outcome
