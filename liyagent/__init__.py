"""liyagent: durable LLM agent runs on Celery, Redis and Postgres.

The public surface users build on; everything here is stable, nothing else is:

    from liyagent import CallContext, tool, agent, client

    @tool.read
    def lookup_order(ctx: CallContext, order_id: str) -> dict: ...

Tools and agents live in the user's own modules, named by `LIYAGENT_TOOLS` (or the
`liyagent.tools` entry-point group); workers, beat, the front and the CLI load them at start.
Runs are started, read and stopped, and approvals decided, through `client()`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from runtime.client import BadRequest, Client, RunView
from runtime.http import SendRefused
from runtime.tools import (
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
from runtime.typed_tools import FunctionTool, agent, tool

if TYPE_CHECKING:
    from runtime.services import Services


def client() -> Client:
    """The client API for this process (start, read, wait for and stop runs; decide
    approvals), publishing run messages through the Celery app (`celery -A tasks`)."""
    from tasks.services import client as celery_client

    return celery_client()


def services() -> Services:
    """This process's engine services (settings, database, Redis, tools), for operators' code."""
    from tasks.services import services as celery_services

    return celery_services()


__all__ = [
    "AgentDef",
    "BadRequest",
    "CallContext",
    "Client",
    "FunctionTool",
    "InvalidArguments",
    "RunView",
    "SendRefused",
    "Tool",
    "ToolDeclarationError",
    "ToolError",
    "ToolInDoubt",
    "ToolKind",
    "agent",
    "client",
    "services",
    "tool",
    "vendor_json",
]
