"""A Pydantic AI agent's MCP toolset (`MCPToolset`) served by liyagent's own MCP client: listed
at declaration, each tool of the kind the team declares (a write when none), the step key on
the call's HTTP request and in its `_meta`, the toolset's token sent and never kept; what
liyagent's client would not do as the toolset asks is refused, naming it. Judged by the MCP
server's own records (tests/support/mcp_server.py, a real process on loopback)."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pydantic_ai import Agent
from pydantic_ai.mcp import MCPToolset
from pydantic_ai.models.test import TestModel

from liyagent.adapters.pydantic_ai import durable
from runtime.sending import http, traffic
from runtime.sending.call_http import CallHTTP
from runtime.toolbox.coroutines import run_coroutine
from runtime.toolbox.tools import CallContext, ToolDeclarationError, ToolKind
from tests.support.mcp_server import Served

TOKEN_ENV = "LYT_GUEST_MCP_TOKEN"
TOKEN = "guest-mcp-token-0815"


@pytest.fixture
def orders(tmp_path: Path) -> Iterator[Served]:
    served = Served(tmp_path, "mcp", "--token-env", TOKEN_ENV, env={**os.environ, TOKEN_ENV: TOKEN})
    yield served
    served.close()


def desk(*toolsets: Any) -> Agent[None, str]:
    return Agent(TestModel(), name="desk", toolsets=list(toolsets))


def call_context(key: str) -> CallContext:
    http = CallHTTP.for_call(key=key, run_id="r", attempt=1, call="1:c", timeout_s=10)
    return CallContext("r", 1, 1, "c", "desk.refund_order", key, True, 10, http)


def test_an_mcp_toolset_is_called_by_liyagents_mcp_client(orders: Served) -> None:
    guest = durable(
        desk(MCPToolset(orders.url, auth=TOKEN)),
        kinds={"lookup_order": "read", "open_case": "keyed_write:86400"},
    )
    tools = {t.name: t for t in guest.tools("here")}
    assert {n: t.kind for n, t in tools.items()} == {
        "desk.lookup_order": ToolKind.READ,
        "desk.refund_order": ToolKind.WRITE,  # no kind declared: a write
        "desk.open_case": ToolKind.KEYED_WRITE,
    }
    assert tools["desk.open_case"].dedupe_window_s == 86400
    # The model is offered the server's tools under the agent's own names, schemas as served.
    offered = {d.name: d for d in guest.provider().params.function_tools}
    assert set(offered) == {"lookup_order", "refund_order", "open_case"}
    assert offered["refund_order"].parameters_json_schema["required"] == [
        "order_id",
        "amount_cents",
        "reason",
    ]
    assert orders.calls() == []  # listing calls no tool

    args = {"order_id": "A-7", "amount_cents": 900, "reason": "late"}
    try:
        with traffic.watched() as seen:
            out = tools["desk.refund_order"].invoke(args, call_context("k-guest-1"))
    finally:  # the server goes with the test: so does this thread's connection to it
        run_coroutine(_close_pooled())
    assert out["refund_id"] == "rf_1" and seen.left
    [refund] = orders.calls("refund_order")
    assert refund["idem_key"] == refund["meta_key"] == "k-guest-1"
    assert refund["auth"] == f"Bearer {TOKEN}" and refund["args"] == args
    # The token is the toolset's, in this process: no tool shows it.
    assert TOKEN not in repr(tools) and TOKEN not in repr(guest.definition("here"))


def test_an_mcp_toolset_is_listed_and_called_inside_a_running_event_loop(orders: Served) -> None:
    """An asyncio app that loads the agent (its `client()` in a handler) and calls its MCP tool
    there: the listing and the call each run on a loop of their own, the app's loop waiting."""

    async def app() -> dict[str, Any]:
        guest = durable(desk(MCPToolset(orders.url, auth=TOKEN)))
        tools = {t.name: t for t in guest.tools("here")}
        args = {"order_id": "A-8", "amount_cents": 100, "reason": "late"}
        try:
            out: dict[str, Any] = tools["desk.refund_order"].invoke(args, call_context("k-loop"))
        finally:
            run_coroutine(_close_pooled())  # the same helper loop the call ran on
        return out

    assert asyncio.run(app())["refund_id"] == "rf_1"
    [refund] = orders.calls("refund_order")
    assert refund["idem_key"] == "k-loop"


async def _close_pooled() -> None:
    """Close the pooled client of the loop this runs on (the thread's, for its tools)."""
    await http.shared_async_client().aclose()


def _per_run(ctx: Any) -> str:
    return TOKEN


def _hook(ctx: Any, call: Any, name: str, args: dict[str, Any]) -> Any:
    return call(name, args)


@pytest.mark.parametrize(
    ("make", "said"),
    [
        (lambda url: MCPToolset(url.rsplit("/", 1)[0] + "/sse"), "reached by SSETransport"),
        (lambda url: MCPToolset(url, auth=_per_run), "auth or headers given as a function"),
        (lambda url: MCPToolset(url, process_tool_call=_hook), "process_tool_call"),
        (lambda url: MCPToolset(url, include_instructions=True), "include_instructions"),
        (lambda url: MCPToolset(url, tool_error_behavior="error"), "tool_error_behavior"),
    ],
    ids=["sse", "auth-function", "hook", "instructions", "tool-errors"],
)
def test_what_liyagents_client_would_not_do_is_refused_naming_it(
    orders: Served, make: Any, said: str
) -> None:
    with pytest.raises(ToolDeclarationError, match=f"pydantic-ai agent desk: .*{said}"):
        durable(desk(make(orders.url)))
    assert orders.calls() == []


def test_a_server_that_cannot_be_listed_stops_the_declaration(orders: Served) -> None:
    with pytest.raises(ToolDeclarationError, match="pydantic-ai agent desk: its MCP toolset"):
        durable(desk(MCPToolset(orders.url)))  # no token: the server answers 401
    with pytest.raises(ToolDeclarationError, match="kinds names tools the agent does not"):
        durable(desk(MCPToolset(orders.url, auth=TOKEN)), kinds={"lookup": "read"})
