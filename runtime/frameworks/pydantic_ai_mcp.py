"""A Pydantic AI agent's MCP toolsets (`pydantic_ai.mcp.MCPToolset`) as liyagent's own MCP
tools (runtime/toolbox/mcp_tools.py): the same client, the same send guard, the step key on
every call's HTTP request and in its `_meta`, settled by the kind the team declares.

Pydantic AI talks to an MCP server through FastMCP, whose calls the engine could not key,
guard or settle; so liyagent lists the server's tools itself, at declaration (a server that
cannot be listed stops the process, as one named by `LIYAGENT_MCP_SERVERS` does), and calls
them itself. What its client would not do as the toolset asks is refused, naming it: a server
not reached over streamable HTTP from a URL (stdio, SSE, a FastMCP client or config), per-run
auth or headers, a client or TLS setting of its own, a hook on its calls, sampling and
elicitation, the server's instructions, a tool-error behaviour other than the default. Its
static headers and bearer token stay in this process: a run stores only the agent's name.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import pydantic
from pydantic_ai.tools import ToolDefinition

from runtime.frameworks import calls as shared
from runtime.toolbox import mcp_tools
from runtime.toolbox.mcp_config import ServerConfig
from runtime.toolbox.tools import Tool, ToolDeclarationError

# A listing that stalls cannot hold a process's start longer than this by default.
LIST_TIMEOUT_S = 10.0


def is_mcp(toolset: object) -> bool:
    """Whether `toolset` is Pydantic AI's MCP toolset (its module imports only with FastMCP
    installed, so it is recognised by its class's home, not imported)."""
    return any(
        c.__module__ == "pydantic_ai.mcp" and c.__name__ == "MCPToolset"
        for c in type(toolset).__mro__
    )


class GuestServer(ServerConfig):
    """An MCP server a framework agent's toolset names: its headers (a token among them) are
    the agent's, given in code, held in this process only and never shown."""

    given: dict[str, str] = pydantic.Field(default_factory=dict, repr=False)

    def headers(self) -> dict[str, str]:
        return {**super().headers(), **self.given}


@dataclass(frozen=True)
class McpTool:
    """One MCP tool of the agent: the engine's tool (its kind still the server's) and the
    definition the model is offered, under the agent's own name for it."""

    tool: Tool
    definition: ToolDefinition


def mcp_tools_of(agent: str, toolset: Any) -> dict[str, McpTool]:
    """The toolset's tools by the agent's names for them, listed now; ToolDeclarationError
    naming the agent and what to do when the toolset cannot be served as liyagent serves MCP."""
    server = guest_server(agent, toolset)
    try:
        listed = mcp_tools.list_tools(server)
    except ToolDeclarationError as exc:
        raise ToolDeclarationError(
            f"pydantic-ai agent {agent}: its MCP toolset {server.url} cannot be listed: {exc}"
        ) from None
    found = {}
    for one in listed:
        schema = dict(one.input_schema or {"type": "object"})
        definition = ToolDefinition(
            name=one.name,
            parameters_json_schema=schema,
            description=one.description or one.title or one.name,
        )
        found[one.name] = McpTool(mcp_tools.to_tool(server, one), definition)
    return found


def guest_server(agent: str, toolset: Any) -> GuestServer:
    """The toolset as a server liyagent's MCP client calls (see the module's docstring)."""
    url = toolset._client_source
    transport = type(getattr(getattr(toolset, "client", None), "transport", None)).__name__
    if not isinstance(url, str) or transport != "StreamableHttpTransport":
        raise _refuse(
            agent,
            f"an MCP toolset reached by {transport} (stdio, SSE, a FastMCP client or config)",
            "serve the server over streamable HTTP and give the toolset its URL",
        )
    options: Mapping[str, Any] = toolset._client_options or {}
    refused = {
        "auth or headers given as a function (per run)": toolset._auth_func is not None
        or toolset._headers_func is not None,
        "auth other than a bearer token string": toolset._static_auth is not None
        and (not isinstance(toolset._static_auth, str) or toolset._static_auth == "oauth"),
        "an http_client or verify of its own": options.get("http_client") is not None
        or options.get("verify") is not None,
        "process_tool_call": toolset.process_tool_call is not None,
        "sampling or elicitation": bool(toolset._server_initiated_handlers),
        "include_instructions": bool(toolset.include_instructions),
        f"tool_error_behavior={toolset.tool_error_behavior!r}": toolset.tool_error_behavior
        != "retry",
    }
    for feature, found in refused.items():
        if found:
            raise _refuse(
                agent,
                f"its MCP toolset's {feature}",
                "give the toolset its URL with static headers or a bearer token; liyagent "
                "calls the server itself (keys, send guard, settlement) and tells the model a "
                "tool's error",
            )
    given = dict(toolset._static_headers or {})
    if isinstance(toolset._static_auth, str):
        given["Authorization"] = f"Bearer {toolset._static_auth}"
    timeout = options.get("init_timeout") or LIST_TIMEOUT_S
    return GuestServer(
        name=f"{agent}/{toolset.id}",
        url=url,
        prefix=f"{agent}.",
        timeout_s=float(timeout),
        given=given,
    )


def _refuse(agent: str, feature: str, instead: str) -> ToolDeclarationError:
    return shared.refused(f"pydantic-ai agent {agent}", feature, instead)
