"""What a Python workflow's function works through: `WorkflowContext` (and `AsyncWorkflowContext`
for `async def`), each step a call with a name, recorded once by the attempt's journal
(runtime/core/flow_steps.py) and replayed from it; the attempt that drives them is
runtime/core/pyflow.py.
"""

from __future__ import annotations

import asyncio
import contextvars
import json
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from pydantic_core import to_jsonable_python

from runtime.core.flow_steps import FlowAttempt, Journal, Outcome, Step
from runtime.toolbox import flow_calls
from runtime.toolbox.tools import ToolKind
from runtime.toolbox.workflow_kinds import (
    StepError,
    StepFailed,
    StepKind,
    StepOutcomeUnknown,
    check_name,
)
from store.db import transaction
from store.signals import take_signal
from store.workflow_events import event_digest, first_event_after, newest_event_id


class WorkflowContext:
    """What a workflow function works through: named steps, each recorded once. Every method
    blocks until its step is done (or the run waits: then the function is left, and replayed
    when the wait is over)."""

    def __init__(self, attempt: FlowAttempt, journal: Journal) -> None:
        self._a = attempt
        self._j = journal

    @property
    def run_id(self) -> str:
        return self._a.run.id

    @property
    def attempt(self) -> int:
        return self._a.run.attempt

    def _id(self, name: str | Named, kind: StepKind) -> str:
        """The step's identity: assigned now (its name's next occurrence), or already (an
        async workflow's, in its coroutine before its first await, so a gather numbers its
        steps in the order it starts them, on every replay)."""
        if isinstance(name, Named):
            return name.identity
        return self._j.identity(name, kind)

    def call_kind(self, tool: str) -> StepKind:
        """A declared tool's call as a step: the tool's kind (a tool not declared here: a
        write, so it is never made blindly; the router refuses it)."""
        declared = self._a.d.tools.get(tool)
        return _KIND_OF.get(declared.kind, StepKind.WRITE) if declared else StepKind.WRITE

    def step(
        self,
        name: str | Named,
        fn: Callable[..., Any],
        *args: Any,
        kind: StepKind | str = StepKind.READ,
        reader: Callable[..., Any] | None = None,
        dedupe_window_s: float | None = None,
        **kwargs: Any,
    ) -> Any:
        """Run `fn(*args, **kwargs)` as the step `name` (a read unless `kind` says it writes);
        its JSON result is recorded and returned again on replay. Inside `fn`,
        `liyagent.current_call()` gives the step's key and an HTTP client that sends it."""
        how = function_kind(name, kind)
        identity = self._id(name, how)
        recorded = {"args": to_jsonable_python(list(args), fallback=_unrecordable(identity))}
        if kwargs:
            recorded["kwargs"] = to_jsonable_python(kwargs, fallback=_unrecordable(identity))
        tool = flow_calls.local_tool(
            f"step:{identity}", how, lambda: fn(*args, **kwargs), reader, args, kwargs,
            dedupe_window_s,
        )  # fmt: skip
        outcome = self._j.make(Step(identity, how, tool.name, recorded, tool))
        return _value(identity, outcome)

    def call(
        self, tool: str, args: dict[str, Any] | None = None, *, step: str | None = None
    ) -> Any:
        """Call a declared tool (one of the workflow's `tools`) as the step `step` (its name by
        default), settled by the tool's kind like an agent's call; its outcome."""
        how = self.call_kind(tool)
        identity = self._id(step or tool, how)
        outcome = self._j.make(Step(identity, how, tool, dict(args or {})))
        return _value(identity, outcome)

    def approval(self, name: str | Named, **details: Any) -> dict[str, Any]:
        """Wait for a person's decision (the run holds no worker meanwhile): `{"approved":
        True, ...}` or `{"approved": False, "by": ..., "reason": ...}`."""
        identity = self._id(name, StepKind.APPROVAL)
        tool = flow_calls.approval_tool(f"step:{identity}")
        outcome = self._j.make(Step(identity, StepKind.APPROVAL, tool.name, details, tool))
        if outcome.get("denied") is True:
            return {"approved": False, "by": outcome.get("by"), "reason": outcome.get("reason")}
        return {"approved": True, **_value(identity, outcome)}

    def agent(
        self,
        name: str | Named,
        *,
        agent: str,
        input: str,
        model: dict[str, Any] | None = None,
        tools: list[str] | None = None,
    ) -> str:
        """Run an agent as a child run and wait for its answer (no worker held): a declared
        agent (its model, tools and system prompt), or any name with `model` (and `tools`,
        none by default). Found again by its key on replay, never started twice; its tools
        must be the workflow's. StepFailed when the child could not start or failed."""
        identity = self._id(name, StepKind.AGENT)
        args: dict[str, Any] = {"agent": agent, "input": input}
        if model is not None:
            args["model"] = model
        if tools is not None:
            args["tools"] = tools
        tool = flow_calls.child_tool(f"step:{identity}")
        outcome = self._j.make(Step(identity, StepKind.AGENT, tool.name, args, tool))
        if "answer" not in outcome:
            raise StepFailed(identity, outcome)
        return str(outcome["answer"])

    def workflow(
        self, name: str | Named, workflow: str, params: dict[str, Any] | None = None
    ) -> Any:
        """Run a declared workflow as a child run and wait for its result (no worker held)."""
        identity = self._id(name, StepKind.WORKFLOW)
        args = {"workflow": workflow, "params": params or {}}
        tool = flow_calls.child_tool(f"step:{identity}")
        outcome = self._j.make(Step(identity, StepKind.WORKFLOW, tool.name, args, tool))
        if "answer" not in outcome:
            raise StepFailed(identity, outcome)
        return json.loads(outcome["answer"])

    def sleep(self, name: str | Named, seconds: float) -> None:
        """Wait `seconds` (minutes to months) holding no worker: the due time is recorded the
        first time, and the run is woken when it comes."""
        identity = self._id(name, StepKind.SLEEP)
        until = self._j.due_at(identity, max(0.0, float(seconds)))
        if time.time() < until:
            self._j.wait(f"timer:{until:.3f}")

    def wait_signal(self, name: str | Named, timeout_s: float | None = None) -> Any:
        """The payload of the next signal `name` sent to this run (`client().signal`), taken
        once; None when `timeout_s` passes first. The run holds no worker while it waits."""
        identity, name = self._waited(name, StepKind.SIGNAL, "signal")
        recorded = self._j.recorded(identity, StepKind.SIGNAL)
        if recorded is not None:
            return recorded.get("value")
        self._j.stop_point(identity, StepKind.SIGNAL)
        a, fence = self._a, self._a.router.fence

        def take() -> tuple[bool, Any]:
            with fence.write() as conn:
                return take_signal(conn, a.run.id, a.run.attempt, name, identity)

        taken, payload = self._j.guarded(take)
        if taken:
            return self._j.settle(identity, StepKind.SIGNAL, payload)
        deadline = self._deadline(identity, timeout_s)
        if deadline is None:
            return self._j.settle(identity, StepKind.SIGNAL, None)
        self._j.wait(f"signal:{name}:{deadline}")

    def wait_event(
        self, name: str | Named, match: str | None = None, timeout_s: float | None = None
    ) -> Any:
        """The payload of the first event `name` (with `match`, when given: an order id, say)
        published after this step was first met (`client().publish_event`); None when
        `timeout_s` passes first. Every workflow waiting for it gets it. No worker is held."""
        identity, name = self._waited(name, StepKind.EVENT, "event")
        recorded = self._j.recorded(identity, StepKind.EVENT)
        if recorded is not None:
            return recorded.get("value")
        self._j.stop_point(identity, StepKind.EVENT)
        engine, principal = self._a.d.engine, self._a.run.principal

        digest = event_digest(name, match)

        def newest() -> int:
            with transaction(engine) as conn:
                return newest_event_id(conn, digest)

        since = int(self._j.mark(f"{identity}.since", newest))

        def first() -> tuple[int, Any] | None:
            with engine.connect() as conn:
                return first_event_after(conn, digest, since, principal)

        found = self._j.guarded(first)
        if found is not None:
            return self._j.settle(identity, StepKind.EVENT, found[1])
        deadline = self._deadline(identity, timeout_s)
        if deadline is None:
            return self._j.settle(identity, StepKind.EVENT, None)
        self._j.wait(f"event:{digest}:{since}:{deadline}")

    def _waited(self, name: str | Named, kind: StepKind, what: str) -> tuple[str, str]:
        """A wait's identity and the name it waits for (StepError for a bad name)."""
        identity = self._id(name, kind)
        name = name.name if isinstance(name, Named) else name
        try:
            check_name(name, what)
        except ValueError as exc:
            raise StepError(str(exc)) from None
        return identity, name

    def _deadline(self, identity: str, timeout_s: float | None) -> str | None:
        """When a wait times out (recorded the first time), as its `waiting_on` says it; None
        once it has passed."""
        if timeout_s is None:
            return "never"
        until = self._j.due_at(f"{identity}.timeout", max(0.0, float(timeout_s)))
        return None if time.time() >= until else f"{until:.3f}"


class AsyncWorkflowContext:
    """`WorkflowContext` for `async def` workflows: each step runs on a thread of its own, so
    `asyncio.gather` runs steps at once, each keeping its identity."""

    def __init__(self, sync: WorkflowContext, pool: ThreadPoolExecutor) -> None:
        self.sync = sync
        self._pool = pool
        self._root: asyncio.Task[Any] | None = None

    @property
    def run_id(self) -> str:
        return self.sync.run_id

    @property
    def attempt(self) -> int:
        return self.sync.attempt

    async def _off(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        ctx = contextvars.copy_context()
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._pool, lambda: ctx.run(fn, *args, **kwargs))

    async def main(self, fn: Callable[..., Any], params: Any) -> Any:
        """Run the workflow's function as the root of its branches."""
        self._root = asyncio.current_task()
        return await fn(self, params)

    def _named(self, name: str, kind: StepKind) -> Named:
        """The step's identity, taken here in its coroutine, never on a pool thread. The root
        task's steps are numbered in its own order. A concurrent branch (a task a gather or
        `create_task` started) numbers its first step within the branch that started it, as
        it starts (a gather starts its tasks in order), and its later steps within that first
        step's identity (`get#2/save#1`): however the branches' steps finish, a replay numbers
        every step the same."""
        task = asyncio.current_task()
        journal = self.sync._j
        if task is self._root:
            return Named(journal.identity(name, kind), name)
        branch = _branch.get()
        if branch is not None and branch.task is task:
            return Named(journal.identity(name, kind, scope=branch.identity), name)
        identity = journal.identity(name, kind, scope=None if branch is None else branch.identity)
        _branch.set(Branch(task, identity))
        return Named(identity, name)

    async def step(
        self, name: str, fn: Callable[..., Any], *args: Any, kind: StepKind | str = StepKind.READ,
        **kwargs: Any,
    ) -> Any:  # fmt: skip
        named = self._named(name, function_kind(name, kind))
        return await self._off(self.sync.step, named, fn, *args, kind=kind, **kwargs)

    async def call(
        self, tool: str, args: dict[str, Any] | None = None, *, step: str | None = None
    ) -> Any:
        named = self._named(step or tool, self.sync.call_kind(tool))
        return await self._off(self.sync.call, tool, args, step=named)

    async def approval(self, name: str, **details: Any) -> dict[str, Any]:
        named = self._named(name, StepKind.APPROVAL)
        decided: dict[str, Any] = await self._off(self.sync.approval, named, **details)
        return decided

    async def agent(self, name: str, **kwargs: Any) -> str:
        return str(await self._off(self.sync.agent, self._named(name, StepKind.AGENT), **kwargs))

    async def workflow(self, name: str, workflow: str, params: dict[str, Any] | None = None) -> Any:
        named = self._named(name, StepKind.WORKFLOW)
        return await self._off(self.sync.workflow, named, workflow, params)

    async def sleep(self, name: str, seconds: float) -> None:
        await self._off(self.sync.sleep, self._named(name, StepKind.SLEEP), seconds)

    async def wait_signal(self, name: str, timeout_s: float | None = None) -> Any:
        named = self._named(name, StepKind.SIGNAL)
        return await self._off(self.sync.wait_signal, named, timeout_s)

    async def wait_event(
        self, name: str, match: str | None = None, timeout_s: float | None = None
    ) -> Any:
        named = self._named(name, StepKind.EVENT)
        return await self._off(self.sync.wait_event, named, match, timeout_s)


_KIND_OF = {
    ToolKind.READ: StepKind.READ,
    ToolKind.WRITE: StepKind.WRITE,
    ToolKind.KEYED_WRITE: StepKind.KEYED_WRITE,
    ToolKind.APPROVAL_WRITE: StepKind.APPROVAL,
    ToolKind.DELEGATION: StepKind.AGENT,
}


@dataclass(frozen=True)
class Named:
    """A step's identity assigned before its step runs (an async workflow's), with the name
    it was asked for."""

    identity: str
    name: str


@dataclass(frozen=True)
class Branch:
    """The concurrent branch (an asyncio task) an async workflow's step runs in: the task, and
    the identity its steps are numbered under (its first step's)."""

    task: asyncio.Task[Any] | None
    identity: str


# The branch the running task numbers its steps in; a task a branch starts inherits it (a copy
# of its context) and numbers its own first step within it.
_branch: contextvars.ContextVar[Branch | None] = contextvars.ContextVar(
    "liyagent_flow_branch", default=None
)


def function_kind(name: object, kind: StepKind | str) -> StepKind:
    """A function step's kind: a read, a write or a keyed write (StepError otherwise)."""
    try:
        how = StepKind(kind)
    except ValueError:
        how = None
    if how not in (StepKind.READ, StepKind.WRITE, StepKind.KEYED_WRITE):
        raise StepError(f"step {name}: a function step is a read, a write or a keyed write")
    return how


def _unrecordable(identity: str) -> Callable[[Any], Any]:
    def refuse(value: Any) -> Any:
        raise StepError(
            f"step {identity}: an argument of type {type(value).__name__} cannot be recorded; "
            "pass JSON values; nothing was recorded or made"
        )

    return refuse


def _value(identity: str, outcome: Outcome) -> Any:
    """What a step gives the workflow: its value, or the failure its record holds, raised."""
    if outcome.get("outcome") in ("unknown", "not_found"):
        raise StepOutcomeUnknown(identity, outcome)
    if "refused" in outcome or "error" in outcome:
        raise StepFailed(identity, outcome)
    if set(outcome) == {"value"}:
        return outcome["value"]
    return outcome
