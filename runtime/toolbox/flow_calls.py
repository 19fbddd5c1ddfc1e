"""The calls a Python workflow's own steps make, as tools the call router routes: a function
step (read, write, keyed write), an approval, a child run. Routed like any tool's call, they
get the same marks, keys, settlement and send guard; inside a step's function
`current_call()` gives its `CallContext` (its key, an HTTP client that sends it).
"""

from __future__ import annotations

import asyncio
import contextvars
import inspect
from collections.abc import Callable
from typing import Any

from pydantic_core import to_jsonable_python

from runtime.toolbox.tools import CallContext, Outcome, Tool, ToolError, ToolKind
from runtime.toolbox.workflow_kinds import StepKind

_current: contextvars.ContextVar[CallContext | None] = contextvars.ContextVar(
    "liyagent_current_call", default=None
)
_TOOL_KIND = {
    StepKind.READ: ToolKind.READ,
    StepKind.WRITE: ToolKind.WRITE,
    StepKind.KEYED_WRITE: ToolKind.KEYED_WRITE,
}


def current_call() -> CallContext:
    """The call of the workflow step (or tool) running now: its idempotency key and an HTTP
    client that sends it; RuntimeError outside a step."""
    call = _current.get()
    if call is None:
        raise RuntimeError("current_call() is only available inside a workflow step's function")
    return call


def _run(fn: Callable[[], Any]) -> Any:
    value = fn()
    if inspect.isawaitable(value):

        async def wait() -> Any:
            return await value

        value = asyncio.run(wait())
    return value


def _recorded(name: str, value: Any) -> Any:
    try:
        return to_jsonable_python(value)
    except Exception as exc:
        raise ToolError(
            f"{name}: its result cannot be recorded ({type(exc).__name__}: {exc}); return JSON "
            "values (a model's model_dump())"
        ) from None


def local_tool(
    name: str,
    kind: StepKind,
    fn: Callable[[], Any],
    reader: Callable[..., Any] | None,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    dedupe_window_s: float | None,
) -> Tool:
    """A function step as a tool: its result wrapped as `{"value": ...}`; a reader, given the
    step's arguments, finds a write's outcome by its key (None: not found)."""

    def invoke(_: dict[str, Any], call: CallContext) -> Outcome:
        token = _current.set(call)
        try:
            return {"value": _recorded(name, _run(fn))}
        finally:
            _current.reset(token)

    def read_back(_: dict[str, Any], call: CallContext) -> Outcome | None:
        assert reader is not None
        token = _current.set(call)
        try:
            found = _run(lambda: reader(*args, **kwargs))
        finally:
            _current.reset(token)
        return None if found is None else {"value": _recorded(name, found)}

    return Tool(
        name=name,
        kind=_TOOL_KIND[kind],
        description=f"workflow step {name}",
        invoke=invoke,
        reader=read_back if reader is not None else None,
        dedupe_window_s=dedupe_window_s,
        origin="workflow",
    )


def approval_tool(name: str) -> Tool:
    """An approval step: held until a person decides; approved, it records the approval id."""

    def invoke(_: dict[str, Any], call: CallContext) -> Outcome:
        return {"value": {"approval_id": call.key}}

    def read_back(_: dict[str, Any], call: CallContext) -> Outcome:
        return invoke(_, call)  # nothing was sent anywhere: its outcome is the decision

    return Tool(
        name,
        ToolKind.APPROVAL_WRITE,
        f"workflow approval {name}",
        invoke,
        reader=read_back,
        origin="workflow",
    )


def child_tool(name: str) -> Tool:
    """A child run (an agent's or a workflow's), started once by its delegation key."""

    def invoke(_: dict[str, Any], call: CallContext) -> Outcome:  # pragma: no cover - routed
        raise ToolError(f"{name}: a child run is started by the engine, never invoked")

    return Tool(name, ToolKind.DELEGATION, f"workflow child run {name}", invoke, origin="workflow")
