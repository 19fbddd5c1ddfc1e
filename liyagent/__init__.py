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

from typing import TYPE_CHECKING

from runtime.entries.aclient import AsyncClient
from runtime.entries.client import BadRequest, Client
from runtime.entries.run_view import OutputMismatch, RunView
from runtime.ops.events import EventKind, EventPage, RunEvent
from runtime.sending.http import SendRefused
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

if TYPE_CHECKING:
    from runtime.services import Services


def client() -> Client:
    """The client API for this process (start, read, wait for and stop runs; decide
    approvals), publishing run messages through the Celery app (`celery -A tasks`)."""
    from tasks.services import client as celery_client

    return celery_client()


def aclient() -> AsyncClient:
    """`client()` for asyncio apps: the same methods as coroutines, and
    `async for event in aclient().events(run_id)` to follow a run's events."""
    return AsyncClient(client())


def declared_agent(name: str) -> AgentDef:
    """The agent named `name`, declared in the catalog file (`LIYAGENT_AGENTS_FILE`) or in
    Python in a tool module; BadRequest listing the known agents when there is none."""
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
    from tasks.services import services as celery_services

    return celery_services()


__all__ = [
    "AgentDef",
    "AsyncClient",
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
    "OutputMismatch",
    "RunEvent",
    "RunView",
    "SendRefused",
    "Tool",
    "ToolDeclarationError",
    "ToolError",
    "ToolInDoubt",
    "ToolKind",
    "aclient",
    "agent",
    "client",
    "declared_agent",
    "job",
    "services",
    "start_agent",
    "tool",
    "vendor_json",
]
