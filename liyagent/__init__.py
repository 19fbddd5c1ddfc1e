"""liyagent: durable LLM agent runs on Celery, Redis and Postgres.

The public surface users build on; everything here is stable, nothing else is:

    from liyagent import CallContext, tool, agent, client

    @tool.read
    def lookup_order(ctx: CallContext, order_id: str) -> dict: ...

Tools, agents and job kinds (`@job`) live in the user's own modules, named by `LIYAGENT_TOOLS`
(or the `liyagent.tools` entry-point group); workers, beat, the front and the CLI load them at
start.
Runs are started, read and stopped, and approvals decided, through `client()`; a declared
agent's run starts with `start_agent(name, input)`. An agent declared with an output type
(`agent(..., output=Answer)`, or a framework agent's `output_type`) ends with a value of it:
`client().wait(run_id).output` is that value (an `Answer`) in a process that declares the
agent, its JSON in `output_json`, and `view.output_as(Answer)` reads it as a type by name.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from runtime.base.refused import BadRequest
    from runtime.core.flow_context import AsyncWorkflowContext, WorkflowContext
    from runtime.entries.aclient import AsyncClient
    from runtime.entries.client import Client
    from runtime.ops.events import EventKind, EventPage, RunEvent
    from runtime.ops.run_view import OutputMismatch, RunView
    from runtime.sending.http import SendRefused
    from runtime.services import Services
    from runtime.toolbox.flow_calls import current_call
    from runtime.toolbox.job_kinds import JobContext, JobError, JobKind, JobParams, job
    from runtime.toolbox.tools import (
        AgentDef,
        CallContext,
        InvalidArguments,
        Tool,
        ToolDeclarationError,
        ToolError,
        ToolInDoubt,
        ToolKind,
        vendor_json,
    )
    from runtime.toolbox.typed_tools import FunctionTool, agent, tool
    from runtime.toolbox.workflow_kinds import (
        StepError,
        StepFailed,
        StepKind,
        StepOutcomeUnknown,
        WorkflowDiverged,
        WorkflowKind,
        WorkflowParams,
        WorkflowStopped,
        workflow,
    )
    from store.errors import LiyagentError

# Where each public name lives. `import liyagent` imports none of them: a name is imported on
# first use (`from liyagent import tool` loads the tool declarations, not the client, Celery or
# the database), so the CLI, a worker and a team's module each pay for what they touch. mypy
# reads the imports above; the same names, one place (tests/unit/project/test_public_surface.py).
_HOMES = {
    "AgentDef": "runtime.toolbox.tools",
    "AsyncClient": "runtime.entries.aclient",
    "AsyncWorkflowContext": "runtime.core.flow_context",
    "BadRequest": "runtime.base.refused",
    "CallContext": "runtime.toolbox.tools",
    "Client": "runtime.entries.client",
    "EventKind": "runtime.ops.events",
    "EventPage": "runtime.ops.events",
    "FunctionTool": "runtime.toolbox.typed_tools",
    "InvalidArguments": "runtime.toolbox.tools",
    "JobContext": "runtime.toolbox.job_kinds",
    "JobError": "runtime.toolbox.job_kinds",
    "JobKind": "runtime.toolbox.job_kinds",
    "JobParams": "runtime.toolbox.job_kinds",
    "LiyagentError": "store.errors",
    "OutputMismatch": "runtime.ops.run_view",
    "RunEvent": "runtime.ops.events",
    "RunView": "runtime.ops.run_view",
    "SendRefused": "runtime.sending.http",
    "StepError": "runtime.toolbox.workflow_kinds",
    "StepFailed": "runtime.toolbox.workflow_kinds",
    "StepKind": "runtime.toolbox.workflow_kinds",
    "StepOutcomeUnknown": "runtime.toolbox.workflow_kinds",
    "Tool": "runtime.toolbox.tools",
    "ToolDeclarationError": "runtime.toolbox.tools",
    "ToolError": "runtime.toolbox.tools",
    "ToolInDoubt": "runtime.toolbox.tools",
    "ToolKind": "runtime.toolbox.tools",
    "WorkflowContext": "runtime.core.flow_context",
    "WorkflowDiverged": "runtime.toolbox.workflow_kinds",
    "WorkflowKind": "runtime.toolbox.workflow_kinds",
    "WorkflowParams": "runtime.toolbox.workflow_kinds",
    "WorkflowStopped": "runtime.toolbox.workflow_kinds",
    "agent": "runtime.toolbox.typed_tools",
    "current_call": "runtime.toolbox.flow_calls",
    "job": "runtime.toolbox.job_kinds",
    "tool": "runtime.toolbox.typed_tools",
    "vendor_json": "runtime.toolbox.tools",
    "workflow": "runtime.toolbox.workflow_kinds",
}

if not TYPE_CHECKING:  # mypy sees the imports above, so an unknown name stays an error there

    def __getattr__(name: str) -> Any:
        """A public name, imported from its home on first use (then kept here)."""
        home = _HOMES.get(name)
        if home is None:
            raise AttributeError(f"module 'liyagent' has no attribute {name!r}")
        value = getattr(importlib.import_module(home), name)
        globals()[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted({*globals(), *__all__})


def client() -> Client:
    """The client API for this process (start, read, wait for and stop runs; decide
    approvals), publishing run messages through liyagent's Celery app (the one
    `celery -A liyagent.worker` runs). Raises ForeignModule when a module of this process takes
    one of liyagent's top-level names (liyagent/own_modules.py)."""
    from liyagent import own_modules

    own_modules.require()
    from tasks.services import client as celery_client

    return celery_client()


def aclient() -> AsyncClient:
    """`client()` for asyncio apps: the same methods as coroutines, and
    `async for event in aclient().events(run_id)` to follow a run's events."""
    from runtime.entries.aclient import AsyncClient

    return AsyncClient(client())


def declared_agent(name: str) -> AgentDef:
    """The agent named `name`, declared in the catalog file (`LIYAGENT_AGENTS_FILE`) or in
    Python in a tool module; BadRequest listing the known agents when there is none."""
    from runtime.base.refused import BadRequest
    from runtime.base.settings import get_settings
    from runtime.core.catalog import CatalogError
    from runtime.entries.start import UnknownAgent, catalog_agent
    from runtime.services import registry_for

    settings = get_settings()
    try:
        return catalog_agent(settings, registry_for(settings), name)
    except (CatalogError, UnknownAgent) as exc:
        raise BadRequest(
            f"{exc} (agents come from {settings.agents_file} and the modules LIYAGENT_TOOLS names)"
        ) from None


def start_agent(name: str, user_input: str, *, request_key: str | None = None) -> str:
    """Start a run of a declared agent with its own model, tools and system prompt; the same
    request key returns the same run. Returns the run id (wait with `client().wait(id)`);
    `client().start_agent` and `await aclient().start_agent(...)` do the same."""
    return client().start_agent(name, user_input, request_key=request_key)


def services() -> Services:
    """This process's engine services (settings, database, Redis, tools), for operators' code."""
    from liyagent import own_modules

    own_modules.require()
    from tasks.services import services as celery_services

    return celery_services()


__all__ = [
    "AgentDef",
    "AsyncClient",
    "AsyncWorkflowContext",
    "BadRequest",
    "CallContext",
    "Client",
    "EventKind",
    "EventPage",
    "FunctionTool",
    "InvalidArguments",
    "JobContext",
    "JobError",
    "JobKind",
    "JobParams",
    "LiyagentError",
    "OutputMismatch",
    "RunEvent",
    "RunView",
    "SendRefused",
    "StepError",
    "StepFailed",
    "StepKind",
    "StepOutcomeUnknown",
    "Tool",
    "ToolDeclarationError",
    "ToolError",
    "ToolInDoubt",
    "ToolKind",
    "WorkflowContext",
    "WorkflowDiverged",
    "WorkflowKind",
    "WorkflowParams",
    "WorkflowStopped",
    "aclient",
    "agent",
    "client",
    "current_call",
    "declared_agent",
    "job",
    "services",
    "start_agent",
    "tool",
    "vendor_json",
    "workflow",
]
