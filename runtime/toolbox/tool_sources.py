"""Where tools come from: the modules `LIYAGENT_TOOLS` names (as Celery's `include` names task
modules), the `liyagent.tools` entry-point group, MCP servers, and the engine's own. Job kinds
(`@job`) come from the same modules, and from `LIYAGENT_JOB_MODULES` (the built-in kinds).

Every process (worker, beat, front, CLI) loads them at start; a module that fails to import, a
tool registered twice, a keyed write without a window or an unknown kind stops the process with
a message naming the module and the tool.
"""

from __future__ import annotations

import importlib
import os
import traceback
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from importlib.metadata import entry_points
from types import ModuleType
from typing import Any

from runtime.toolbox.guests import GuestAgent
from runtime.toolbox.job_kinds import JobDeclarationError, JobKind
from runtime.toolbox.tools import (
    AgentDef,
    Tool,
    ToolDeclarationError,
    ToolError,
    ToolKind,
    ToolRegistry,
)
from runtime.toolbox.typed_tools import FunctionTool
from runtime.toolbox.workflow_kinds import WorkflowDeclarationError, WorkflowKind

ENTRY_POINT_GROUP = "liyagent.tools"


def _engine_routed(args: dict[str, Any], ctx: Any) -> dict[str, Any]:
    raise ToolError("a delegation is routed by the engine, never invoked directly")


def engine_tools() -> list[Tool]:
    """The tools the engine routes itself: asking a sub-agent."""
    return [
        Tool(
            "agent.delegate",
            ToolKind.DELEGATION,
            "Ask a sub-agent: give it an agent name and the input text; its answer comes back.",
            _engine_routed,
            parameters={
                "type": "object",
                "properties": {
                    "agent": {"type": "string", "description": "the sub-agent's name"},
                    "input": {"type": "string", "description": "what to ask it"},
                },
                "required": ["agent", "input"],
            },
        )
    ]


@dataclass
class Declared:
    """What one module (or entry point) declares."""

    tools: list[Tool] = field(default_factory=list)
    agents: list[AgentDef] = field(default_factory=list)
    jobs: list[JobKind] = field(default_factory=list)
    guests: list[GuestAgent] = field(default_factory=list)
    workflows: list[WorkflowKind] = field(default_factory=list)

    def add_guest(self, guest: GuestAgent, origin: str) -> None:
        """A framework agent: itself, its tools and its definition."""
        self.guests.append(guest)
        self.tools += guest.tools(origin)
        self.agents.append(guest.definition(origin))


def declared_in(module: ModuleType) -> Declared:
    """The tools, agents and job kinds a module declares at its top level: tools and jobs
    defined in it (one it imports from another module belongs to that module, so naming both
    loads it once)."""
    origin = f"module {module.__name__}"
    tools: list[Tool] = []
    agents: list[AgentDef] = []
    jobs: list[JobKind] = []
    found = Declared(tools, agents, jobs)
    for value in vars(module).values():
        if isinstance(value, GuestAgent):
            found.add_guest(value, origin)
            continue
        if isinstance(value, JobKind | WorkflowKind):
            # A package declares the kinds its own submodules define and it exports.
            fn = value.run if isinstance(value, JobKind) else value.fn
            home = str(getattr(fn, "__module__", module.__name__))
            inside = hasattr(module, "__path__") and home.startswith(f"{module.__name__}.")
            if home == module.__name__ or inside:
                if isinstance(value, JobKind):
                    jobs.append(replace(value, origin=origin))
                else:
                    found.workflows.append(replace(value, origin=origin))
            continue
        if isinstance(value, FunctionTool):
            if getattr(value.fn, "__module__", module.__name__) == module.__name__:
                tools.append(value.to_tool(origin))
        elif isinstance(value, Tool):
            if getattr(value.invoke, "__module__", module.__name__) == module.__name__:
                tools.append(replace(value, origin=origin))
        elif isinstance(value, AgentDef):
            agents.append(replace(value, origin=origin))
    return found


def import_module(name: str, setting: str) -> ModuleType:
    try:
        return importlib.import_module(name)
    except (ToolDeclarationError, JobDeclarationError, WorkflowDeclarationError) as exc:
        raise ToolDeclarationError(f"{setting}: module {name}: {exc}") from None
    except Exception as exc:
        where = traceback.extract_tb(exc.__traceback__)[-1]
        raise ToolDeclarationError(
            f"{setting}: module {name} failed to import ({type(exc).__name__}: {exc}, at "
            f"{where.filename}:{where.lineno}); fix it or remove it from {setting}"
        ) from None


def module_key(module: ModuleType) -> str:
    """What makes a module one: its file (resolved), so a module imported under two names
    (`acme.tools` and `tools`, from two entries of sys.path) or named twice is loaded once."""
    file = getattr(module, "__file__", None)
    return os.path.realpath(file) if file else module.__name__


def _from_entry_points(seen: set[str]) -> Iterable[Declared]:
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        setting = f"entry point {ep.name} ({ENTRY_POINT_GROUP})"
        module, _, attr = ep.value.partition(":")
        loaded = import_module(module.strip(), setting)
        if not attr:
            if module_key(loaded) not in seen:
                seen.add(module_key(loaded))
                yield declared_in(loaded)
            continue
        target = getattr(loaded, attr.strip(), None)
        if target is None:
            raise ToolDeclarationError(f"{setting}: {ep.value} names nothing")
        declaration = isinstance(target, FunctionTool | JobKind)
        values = target() if callable(target) and not declaration else target
        items = list(values) if isinstance(values, list | tuple) else [values]
        tools = [v.to_tool(setting) if isinstance(v, FunctionTool) else v for v in items]
        declared = Declared(
            [t for t in tools if isinstance(t, Tool)],
            [v for v in items if isinstance(v, AgentDef)],
            [replace(v, origin=setting) for v in items if isinstance(v, JobKind)],
        )
        for guest in items:
            if isinstance(guest, GuestAgent):
                declared.add_guest(guest, setting)
        yield declared


def load_registry(
    modules: Iterable[str],
    kinds: dict[str, str] | None = None,
    extra: Iterable[Callable[[], list[Tool]]] = (),
    use_entry_points: bool = True,
    job_modules: Iterable[str] = (),
) -> ToolRegistry:
    """Every tool, agent and job kind this process may use, with operators' reclassifications
    applied (`LIYAGENT_TOOL_KINDS`); raises ToolDeclarationError naming what is wrong."""
    tools = engine_tools()
    agents: list[AgentDef] = []
    jobs: list[JobKind] = []
    guests: list[GuestAgent] = []
    workflows: list[WorkflowKind] = []
    seen: set[str] = set()
    named = [(n, "LIYAGENT_JOB_MODULES") for n in job_modules]
    for name, setting in [*named, *((n, "LIYAGENT_TOOLS") for n in modules)]:
        module = import_module(name, setting)
        if module_key(module) in seen:
            continue  # the same module, named again or under another name
        seen.add(module_key(module))
        found = declared_in(module)
        if not (found.tools or found.agents or found.jobs or found.workflows):
            raise ToolDeclarationError(
                f"{setting}: module {name} declares no tools, agents, job kinds or workflows "
                "(declare them at its top level with @tool.read, @tool.write, ..., agent(...), "
                "@job(...) or @workflow(...))"
            )
        tools += found.tools
        agents += found.agents
        jobs += found.jobs
        guests += found.guests
        workflows += found.workflows
    if use_entry_points:
        for found in _from_entry_points(seen):
            tools += found.tools
            agents += found.agents
            jobs += found.jobs
            guests += found.guests
            workflows += found.workflows
    for source in extra:
        tools += source()
    registry = ToolRegistry(_reclassified(tools, kinds or {}), agents, jobs, guests, workflows)
    for agent in registry.agents.values():
        unknown = registry.unknown(agent.tools or ())
        if unknown:
            raise ToolDeclarationError(
                f"agent {agent.name} ({agent.origin}) names tools no module declares: "
                f"{', '.join(unknown)}; known: {', '.join(registry.names())}"
            )
    for flow in registry.workflows.values():
        unknown = registry.unknown(flow.tools)
        if unknown:
            raise ToolDeclarationError(
                f"workflow {flow.name} ({flow.origin}) names tools no module declares: "
                f"{', '.join(unknown)}; known: {', '.join(registry.names())}"
            )
    return registry


def _reclassified(tools: list[Tool], kinds: dict[str, str]) -> list[Tool]:
    known = {t.name for t in tools}
    unknown = sorted(set(kinds) - known)
    if unknown:
        raise ToolDeclarationError(f"LIYAGENT_TOOL_KINDS names unknown tools: {unknown}")
    out = []
    for tool in tools:
        if tool.name not in kinds:
            out.append(tool)
            continue
        try:
            kind = ToolKind(kinds[tool.name])
        except ValueError:
            raise ToolDeclarationError(
                f"LIYAGENT_TOOL_KINDS: {tool.name}={kinds[tool.name]!r} is not a kind; use "
                f"{', '.join(k.value for k in ToolKind)}"
            ) from None
        # A tool reclassified as a read is made again on resume; it has nothing to read back.
        reader = None if kind is ToolKind.READ else tool.reader
        out.append(replace(tool, kind=kind, reader=reader))
    return out
