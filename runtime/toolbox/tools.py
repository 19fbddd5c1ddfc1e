"""Tools declare what they are, so the engine knows how to make and settle each call.

A `Tool` is whatever the model may call: a user's typed Python function (`typed_tools.py`), a
tool an MCP server serves (`mcp_tools.py`), or one the engine routes itself (delegation). The
engine owns keys, marks, settlement and the send guard; a tool only declares its kind (and its
reader or dedupe window) and uses the `CallContext` it is given.
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Any

import httpx

from runtime.durable.policy import Instructions, Policy
from runtime.models.output import OutputType
from runtime.sending import http, traffic
from runtime.sending.call_http import CallHTTP
from runtime.toolbox.job_kinds import JobKind
from runtime.toolbox.workflow_kinds import WorkflowKind
from store.errors import LiyagentError

Outcome = dict[str, Any]


class ToolKind(StrEnum):
    READ = "read"  # harmless to make again; never marked
    WRITE = "write"  # changes something; settled by its reader, else reported unknown
    KEYED_WRITE = "keyed_write"  # its vendor dedupes on the step key for `dedupe_window_s`
    APPROVAL_WRITE = "approval_write"  # held until a person approves; sent with the approval id
    DELEGATION = "delegation"  # a sub-agent run, created and found again by its delegation key
    REMOTE_AGENT = "remote_agent"  # another agent over A2A; settled by reading its task back

    @property
    def changes(self) -> bool:
        return self is not ToolKind.READ


@dataclass(frozen=True)
class CallContext:
    """What a tool gets for one call: who makes it, its idempotency key, and an HTTP client
    that sends that key (`Idempotency-Key`) and passes the engine's send guard."""

    run_id: str
    attempt: int
    step: int
    call_id: str
    tool: str
    # The step's idempotency key; the same for every execution of this call (I8).
    key: str
    # False when the key is fresh per call (a positional provider id, an ad hoc call).
    stable_key: bool
    timeout_s: float
    http: CallHTTP = field(repr=False)

    def check_send(self) -> None:
        """Raise `SendRefused` unless this attempt may still send (its lease's local deadline,
        no network). `ctx.http` does this as the bytes leave; a tool sending with a client of
        its own (a vendor SDK) calls it right before its request, which from then on counts
        the call as possibly sent (in doubt if it fails)."""
        http.check_leaving()


class ToolError(LiyagentError):
    """The call was refused for good (the vendor said no, the input is wrong): its outcome is
    this error, told to the model. Nothing is in doubt. `status` is the vendor's HTTP status."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class ToolFailed(ToolError):
    """The tool raised while no request of its call had left the send guard: it failed for
    certain (nothing was sent, nothing changed). The model is told the error's type and
    message; `cause` is what the tool raised, logged with its traceback."""

    def __init__(self, message: str, cause: BaseException) -> None:
        super().__init__(message)
        self.cause = cause

    def outcome(self) -> Outcome:
        return {
            "error": str(self),
            "failed": True,
            "note": "The tool failed before any request of this call left the worker: nothing "
            "was sent and nothing changed. Fix what the error names before calling it again.",
        }


class ToolInDoubt(LiyagentError):
    """The call may or may not have reached its vendor (timeout, reset, 5xx)."""


def failure(said: str, exc: BaseException) -> ToolFailed | ToolInDoubt:
    """What an unexpected error of a tool means, by what the send guard saw of its call: failed
    for certain while none of its requests had left, else in doubt (also when no call is
    watched: unknown counts as in doubt)."""
    if traffic.nothing_left():
        return ToolFailed(said, exc)
    return ToolInDoubt(said)


def classify(exc: Exception) -> ToolError | ToolInDoubt:
    """What anything else a tool raised means: an `httpx` 4xx from `raise_for_status()` is a
    definite refusal and a 5xx in doubt; any other error is a `failure`."""
    if isinstance(exc, httpx.HTTPStatusError):
        status = exc.response.status_code
        said = f"{exc.request.method} {exc.request.url.path}: {status} {exc.response.text[:300]}"
        return ToolInDoubt(said) if status >= 500 else ToolError(said, status)
    return failure(f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__, exc)


class InvalidArguments(ToolError):
    """The model's arguments do not fit the tool's parameters; the call was not made."""

    def __init__(self, tool: str, problems: list[dict[str, str]]) -> None:
        super().__init__(
            f"arguments of {tool} do not fit its parameters: "
            + "; ".join(f"{p['field']}: {p['message']}" for p in problems)
        )
        self.problems = problems

    def outcome(self) -> Outcome:
        return {
            "error": "invalid arguments; the call was not made",
            "problems": self.problems,
            "hint": "call the tool again with arguments that fit its parameters",
        }


def vendor_json(what: str, send: Callable[[], httpx.Response]) -> Any:
    """Make one vendor request and read its JSON answer: a 4xx is a definite refusal
    (`ToolError`); a 5xx, a timeout or a lost connection leaves the call in doubt, unless no
    request of the call had left (a refused connection: `ToolFailed`)."""
    try:
        response = send()
    except (httpx.TimeoutException, httpx.NetworkError, httpx.RemoteProtocolError) as exc:
        raise failure(f"{what}: {type(exc).__name__}: {exc}", exc) from exc
    except httpx.HTTPError as exc:
        raise ToolError(f"{what}: {exc}") from exc
    if response.status_code >= 500:
        raise ToolInDoubt(f"{what}: the vendor answered {response.status_code}")
    if response.status_code >= 400:
        raise ToolError(
            f"{what}: {response.status_code} {response.text[:300]}", response.status_code
        )
    return response.json()


Invoke = Callable[[dict[str, Any], CallContext], Outcome]
# A reader returns the call's outcome found by its key, or None when it finds none.
Reader = Callable[[dict[str, Any], CallContext], Outcome | None]
Validate = Callable[[dict[str, Any]], dict[str, Any]]


def _no_check(args: dict[str, Any]) -> dict[str, Any]:
    return args


@dataclass(frozen=True)
class Tool:
    """One tool: its name and kind, the schema the model sees, and how to call and read it."""

    name: str
    kind: ToolKind
    description: str
    invoke: Invoke
    reader: Reader | None = None
    dedupe_window_s: float | None = None
    parameters: dict[str, Any] | None = None
    # Checks (and normalises) the model's arguments before anything is marked or sent;
    # raises InvalidArguments.
    validate: Validate = _no_check
    # Where it was declared (a module, an MCP server), for start-up errors.
    origin: str = "liyagent"
    # The source location of a function tool (file:line): one declaration loaded twice (a
    # module under two names, or named by LIYAGENT_TOOLS and an entry point) is one tool.
    declared_at: str | None = None

    def __post_init__(self) -> None:
        if self.kind is ToolKind.KEYED_WRITE and not self.dedupe_window_s:
            raise ToolDeclarationError(
                f"tool {self.name} ({self.origin}): a keyed write must declare its vendor's "
                "dedupe window (dedupe_window_s)"
            )
        if self.reader is not None and self.kind is ToolKind.READ:
            raise ToolDeclarationError(
                f"tool {self.name} ({self.origin}): a read needs no reader; declare the write "
                "it reads back"
            )

    def make(self, args: dict[str, Any], ctx: CallContext) -> Outcome:
        """Invoke the tool, whatever it raises told apart: `ToolError` (`ToolFailed` among
        them) or `ToolInDoubt`; the send guard's refusal passes untouched, to stop the attempt."""
        try:
            return self.invoke(args, ctx)
        except (ToolError, ToolInDoubt, http.SendRefused):
            raise
        except Exception as exc:
            raise classify(exc) from exc

    def schema(self) -> dict[str, Any]:
        """The tool as a model sees it."""
        return {
            "name": self.name,
            "description": self.description,
            "parameters": self.parameters or {"type": "object", "properties": {}},
        }


def declared_at(fn: Callable[..., Any]) -> str | None:
    """Where a function is defined (its file, resolved, and first line): the same declaration
    reached through two module names, or a module and an entry point, is one tool (or job)."""
    code = getattr(inspect.unwrap(fn), "__code__", None)
    if code is None:
        return None
    return f"{os.path.realpath(code.co_filename)}:{code.co_firstlineno}"


class ToolDeclarationError(LiyagentError, ValueError):
    """A tool is declared wrong (no window, unknown kind, a name used twice); the message names
    the tool and where it came from. Processes refuse to start with it."""


@dataclass(frozen=True)
class AgentDef:
    """An agent: its model, the tools it may use by name, its system prompt; and what the
    public A2A card may say of it (`description`, never the prompt, tools or model)."""

    name: str
    model: dict[str, Any]
    tools: list[str] | None
    system: str | None
    origin: str = "catalog"
    description: str | None = None
    # The type liyagent's loop checks its final answer against (`agent(..., output=...)`);
    # None for text. A framework's agent checks its own (`GuestAgent.output_type`).
    output: OutputType | None = None
    # What its runs do when a worker's code no longer serves their pinned definition
    # (runtime/durable/pins.py): wait for one that does (pinned), or take the new one.
    definition_policy: Policy = Policy.PINNED

    def output_schema(self) -> dict[str, Any] | None:
        """Its output type's JSON schema, as its runs carry it (sealed with the run)."""
        return None if self.output is None else self.output.schema


def _function(item: JobKind | WorkflowKind) -> Callable[..., Any]:
    return item.run if isinstance(item, JobKind) else item.fn


def _declare(known: dict[str, Any], what: str, name: str, item: JobKind | WorkflowKind) -> None:
    """Add a declared job kind or workflow by name: one declaration reached twice (a module
    under two names) is one; two of one name refuse the start, naming both."""
    first = known.get(name)
    if first is not None:
        where = declared_at(_function(item))
        if where is not None and declared_at(_function(first)) == where:
            return
        raise ToolDeclarationError(
            f"{what} is declared twice: by {first.origin} and by {item.origin}; rename one of them"
        )
    known[name] = item


class ToolRegistry:
    """Tools (and agents and job kinds declared next to them) by name; one registry per
    process."""

    def __init__(
        self,
        tools: Iterable[Tool] = (),
        agents: Iterable[AgentDef] = (),
        jobs: Iterable[JobKind] = (),
        guests: Iterable[Any] = (),
        workflows: Iterable[WorkflowKind] = (),
    ) -> None:
        self._tools: dict[str, Tool] = {}
        self.agents: dict[str, AgentDef] = {}
        self.jobs: dict[str, JobKind] = {}
        # Workflows in Python by name (runtime/toolbox/workflow_kinds.py).
        self.workflows: dict[str, WorkflowKind] = {}
        # Framework agents by name (`runtime/toolbox/guests.py`, `GuestAgent`): what answers
        # the steps of a run whose model spec names one (`Services.provider_for`).
        self.guests: dict[str, Any] = {}
        for tool in tools:
            self.register(tool)
        for agent in agents:
            self.add_agent(agent)
        for kind in jobs:
            self.add_job(kind)
        for guest in guests:
            self.add_guest(guest)
        for flow in workflows:
            self.add_workflow(flow)

    def add_workflow(self, flow: WorkflowKind) -> None:
        _declare(self.workflows, f"workflow {flow.name}", flow.name, flow)

    def add_guest(self, guest: Any) -> None:
        """A framework agent (its tools and definition are registered with the others)."""
        known = self.guests.get(guest.name)
        if known is not None and known is not guest:
            raise ToolDeclarationError(
                f"framework agent {guest.name} is declared twice ({known.framework} and "
                f"{guest.framework}); give one another name"
            )
        self.guests[guest.name] = guest

    def add_job(self, kind: JobKind) -> None:
        _declare(self.jobs, f"job kind {kind.name}", kind.name, kind)

    def register(self, tool: Tool) -> None:
        first = self._tools.get(tool.name)
        if first is not None:
            if tool.declared_at is not None and tool.declared_at == first.declared_at:
                return  # the same declaration, reached twice: one tool
            where = ""
            if first.origin == tool.origin:  # two functions of one module: say where each is
                where = f" (at {first.declared_at} and at {tool.declared_at})"
            raise ToolDeclarationError(
                f"tool {tool.name} is registered twice: by {first.origin} and by "
                f"{tool.origin}{where}; rename one of them"
            )
        self._tools[tool.name] = tool

    def add_agent(self, agent: AgentDef) -> None:
        known = self.agents.get(agent.name)
        if known is not None and replace(known, origin="") == replace(agent, origin=""):
            return  # one declaration reached twice (a module under two names)
        if known is not None:
            raise ToolDeclarationError(
                f"agent {agent.name} is declared twice: by {self.agents[agent.name].origin} and "
                f"by {agent.origin}"
            )
        self.agents[agent.name] = agent

    def get(self, name: str) -> Tool | None:
        return self._tools.get(name)

    def names(self) -> list[str]:
        return sorted(self._tools)

    def unknown(self, names: Iterable[str]) -> list[str]:
        """The names among `names` that no loaded tool has, sorted."""
        return sorted({n for n in names if n not in self._tools})

    def output_type(self, agent: str) -> OutputType | None:
        """The output type this process declares for agent `agent` (a framework agent's, or a
        native agent's), None when it declares none or no such agent."""
        guest = self.guests.get(agent)
        if guest is not None:
            found: OutputType | None = guest.output_type()
            return found
        declared = self.agents.get(agent)
        return None if declared is None else declared.output

    def declared_tool(self, name: str) -> tuple[str, dict[str, Any]] | None:
        """A tool's kind and argument schema as this code declares it (a run's pin,
        runtime/durable/pins.py), None when it has no such tool."""
        tool = self._tools.get(name)
        return None if tool is None else (tool.kind.value, tool.schema()["parameters"])

    def declared_output(self, agent: str) -> dict[str, Any] | None:
        """The JSON schema of the output type this code declares for `agent` (None: text)."""
        output = self.output_type(agent)
        return None if output is None else output.schema

    def declared_instructions(self, agent: str) -> Instructions | None:
        """The instructions this code gives `agent` (a run's pin): a framework agent's, sent by
        its provider with each request, or a native agent's declared system prompt."""
        guest = self.guests.get(agent)
        if guest is not None:
            # None as "": a run of a guest with none is pinned to none (a deploy that adds
            # some is a change it is not asked with, or follows).
            return Instructions(guest.instructions or "", per_request=True)
        declared = self.agents.get(agent)
        if declared is None or declared.system is None:
            return None
        return Instructions(declared.system, per_request=False)

    def declared_model(self, agent: str) -> str | None:
        """The model a framework agent's code asks (a run's pin), None for any other."""
        guest = self.guests.get(agent)
        return None if guest is None else guest.model_name()

    def declared_names(self) -> tuple[list[str], list[str]]:
        """Every tool's and every agent's name (a framework agent's among them): what a code
        version is made of (runtime/durable/pins.py `code_version`)."""
        return self.names(), sorted({*self.agents, *self.guests})

    def schemas(self, allowed: list[str] | None) -> list[dict[str, Any]]:
        """The schemas of exactly the tools a run may use: none when it names none (fail
        closed; a run's list is checked against this registry when it is stored)."""
        return [self._tools[n].schema() for n in allowed or () if n in self._tools]
