"""Workflows in ordinary Python, declared like tools and jobs: a function and its parameters.

    class Refund(WorkflowParams):
        order_id: str

    @workflow(name="orders.refund", tools=["lookup_order", "issue_refund"])
    async def refund(ctx: WorkflowContext, params: Refund) -> dict[str, Any]:
        order = await ctx.call("lookup_order", {"order_id": params.order_id})
        ...

The engine (runtime/core/pyflow.py) drives it: each step goes through the workflow's context
under a name, its result recorded, sealed and chained like an agent's step, and a resume
replays the function, returning recorded results without running their steps again. The
function is ordinary code between steps and must decide the same way on replay (read the clock
or a random number inside a step). Declarations are found in the modules `LIYAGENT_TOOLS`
names, as tools and jobs are.
"""

from __future__ import annotations

import inspect
import json
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, get_type_hints

from pydantic import BaseModel, ConfigDict, ValidationError

from runtime.base.validation import described
from store.errors import LiyagentError

# A step's or a signal's name: what its identity (with its occurrence) is made of.
NAME = re.compile(r"^[A-Za-z0-9_.\-]{1,120}$")


class WorkflowDeclarationError(LiyagentError, ValueError):
    """A workflow is declared wrong (a bad name, a parameters type that is not a model);
    processes refuse to start with it, naming the module."""


class WorkflowParamsError(LiyagentError, ValueError):
    """A workflow's parameters do not fit its parameters model (nothing is stored)."""


class WorkflowParams(BaseModel):
    """A workflow's parameters: unknown ones are refused, so a typo is caught at start."""

    model_config = ConfigDict(extra="forbid")


class StepKind(StrEnum):
    """What a step is, so the engine knows how to take it up after a crash (the tools' kinds)."""

    READ = "read"  # made again on resume
    WRITE = "write"  # read back by its reader, else settled unknown: never sent again
    KEYED_WRITE = "keyed_write"  # sent again with its key inside its vendor's dedupe window
    APPROVAL = "approval"  # held until a person decides
    AGENT = "agent"  # an agent run as a child, found again by its key
    WORKFLOW = "workflow"  # a child workflow run, found again by its key
    SLEEP = "sleep"  # a durable timer: its due time is recorded, no worker waits
    SIGNAL = "signal"  # a message sent to the run, taken once
    EVENT = "event"  # an event published to every workflow waiting for its name and match


def check_name(name: object, what: str) -> str:
    """A step's or signal's name as the engine takes it, or ValueError naming it."""
    if not isinstance(name, str) or not NAME.match(name):
        raise ValueError(
            f"{what} {name!r}: a name is 1-120 letters, digits, '_', '.' or '-' (it makes the "
            "step's identity with its occurrence)"
        )
    return name


@dataclass(frozen=True)
class WorkflowKind:
    """One declared workflow: its name, its function, its parameters model (None: a plain
    dict) and the tools its `ctx.call` steps may use (and only those)."""

    name: str
    fn: Callable[..., Any]
    params: type[BaseModel] | None
    tools: tuple[str, ...] = ()
    origin: str = "python"
    # A Stop raises `WorkflowStopped` in the function (which may catch it to compensate)
    # instead of ending the run at once.
    catches_stop: bool = False

    @property
    def is_async(self) -> bool:
        return inspect.iscoroutinefunction(self.fn)

    def check(self, params: dict[str, Any]) -> Any:
        """The parameters as the function takes them, or WorkflowParamsError naming each field."""
        if self.params is None:
            return dict(params)
        try:
            return self.params.model_validate(params)
        except ValidationError as exc:
            raise WorkflowParamsError(
                f"workflow {self.name}: bad parameters ({described(exc, 'params')})"
            ) from None

    def __call__(self, ctx: Any, params: Any) -> Any:
        """Still callable as the plain function (a team's own tests, a child's replay)."""
        return self.fn(ctx, params)


def start_spec(
    workflow: Any, name: str | None, params: dict[str, Any] | None, user_input: str | None
) -> tuple[str, dict[str, Any], str]:
    """What a workflow run is started with: its name (its runs' agent), its spec (a declared
    workflow, the function or its name, with `params`; or a JSON step graph, a dict) and the
    input text it shows; ValueError when a graph has no name."""
    if isinstance(workflow, dict):
        if name is None:
            raise ValueError("a JSON step graph needs a name; nothing was stored")
        return name, workflow, user_input or "start"
    flow = str(getattr(workflow, "name", workflow))
    given = json.dumps(params or {}, sort_keys=True, default=str)
    text = (user_input or f"{flow} {given}")[:2000]
    return name or flow, {"python": flow, "params": params or {}}, text


def workflow(
    *, name: str, tools: Iterable[str] = (), catches_stop: bool = False
) -> Callable[[Callable[..., Any]], WorkflowKind]:
    """Declare a workflow: `fn(ctx, params)`, sync or async, `params` a `WorkflowParams`
    model (or a plain dict). `tools`: the declared tools its `ctx.call` steps may use.
    `catches_stop`: a Stop raises `WorkflowStopped` at the step the function is at (or
    next makes), so it can undo what it did; otherwise a Stop ends the run at once."""
    try:
        check_name(name, "workflow")
    except ValueError as exc:
        raise WorkflowDeclarationError(str(exc)) from None

    def declare(fn: Callable[..., Any]) -> WorkflowKind:
        return WorkflowKind(
            name, fn, _params_model(fn, name), tuple(tools), catches_stop=bool(catches_stop)
        )

    return declare


def _params_model(fn: Callable[..., Any], name: str) -> type[BaseModel] | None:
    params = list(inspect.signature(fn).parameters)
    if len(params) != 2:
        raise WorkflowDeclarationError(
            f"workflow {name}: declare it as fn(ctx, params) (params: a WorkflowParams model "
            "or a dict)"
        )
    try:
        hints = get_type_hints(fn)
    except Exception as exc:
        raise WorkflowDeclarationError(
            f"workflow {name}: its type hints cannot be read ({exc})"
        ) from exc
    model = hints.get(params[1])
    if isinstance(model, type) and issubclass(model, BaseModel):
        return model
    return None


class StepError(LiyagentError, ValueError):
    """A step asked wrong (a name reused in one workflow with another kind, arguments that
    cannot be recorded: not JSON, over LIYAGENT_STEP_MAX_BYTES): nothing of it was recorded
    or made. Raised where the workflow asked for it."""


class StepFailed(LiyagentError):
    """The step failed for certain (its function raised before anything left, its vendor
    refused, its child run failed): `outcome` is what was recorded, and a replay raises it
    again. Catch it to compensate."""

    def __init__(self, identity: str, outcome: dict[str, Any]) -> None:
        said = outcome.get("error") or outcome.get("refused") or outcome
        super().__init__(f"step {identity} failed: {said}")
        self.identity = identity
        self.outcome = outcome


class StepOutcomeUnknown(StepFailed):
    """A write was in flight when its worker stopped, and its outcome could not be read back:
    it was not sent again (never twice). Check its target before doing it again."""


class WorkflowStopped(LiyagentError):
    """An operator stopped the run (a workflow declared with `catches_stop=True`): raised at the
    step the function was at, or the next one it makes. Catch it to undo what the workflow did
    (compensation steps are made and recorded as usual); the run ends `failed` (code
    `stopped`) whether the function then returns or raises. `in_flight`: the step was in
    flight when the Stop cut it, so it may have happened; check its target."""

    def __init__(self, run_id: str, identity: str, reason: str, in_flight: bool = False) -> None:
        said = " (it was in flight: it may have happened; check its target)" if in_flight else ""
        super().__init__(f"run {run_id}: step {identity}: the run was {reason}{said}")
        self.run_id = run_id
        self.identity = identity
        self.reason = reason
        self.in_flight = in_flight


class WorkflowDiverged(LiyagentError):
    """A replay met a step its record does not hold at that identity (another kind, other
    arguments): it is never paired with that result; the run fails with this reason."""
