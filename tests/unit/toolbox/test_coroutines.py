"""Coroutines run from synchronous code (runtime/toolbox/coroutines.py) inside and outside a
running event loop: an asyncio app that loads its tool modules or calls a tool from its own
loop is served as a worker's plain thread is, the call's context kept, its kept loop reused."""

from __future__ import annotations

import asyncio
import contextvars
import threading
from typing import Any

from agents import Agent as SdkAgent
from agents import function_tool
from agents.testing import ScriptedModel
from pydantic_ai import Agent
from pydantic_ai.models.test import TestModel

from liyagent import CallContext, tool
from liyagent.adapters import openai_agents
from liyagent.adapters.pydantic_ai import durable
from runtime.sending.call_http import CallHTTP
from runtime.toolbox.coroutines import run_coroutine, run_once

WHO: contextvars.ContextVar[str] = contextvars.ContextVar("who", default="nobody")


async def _where() -> tuple[str, int, int]:
    """The context's value, the running loop's id and the thread's."""
    return WHO.get(), id(asyncio.get_running_loop()), threading.get_ident()


def test_a_coroutine_runs_from_inside_a_running_loop_on_one_kept_helper_loop() -> None:
    async def app() -> tuple[Any, ...]:
        WHO.set("the app")
        first = run_coroutine(_where())
        second = run_coroutine(_where())
        return first, second, id(asyncio.get_running_loop()), threading.get_ident()

    (who, loop, thread), again, app_loop, app_thread = asyncio.run(app())
    assert who == "the app"  # the caller's context (the send guard's lives there)
    assert loop != app_loop and thread != app_thread
    assert again == (who, loop, thread)  # the same kept loop: pooled connections stay usable


def test_a_coroutine_runs_on_this_threads_kept_loop_outside_one() -> None:
    token = WHO.set("a worker slot")
    try:
        who, loop, thread = run_coroutine(_where())
        assert (who, thread) == ("a worker slot", threading.get_ident())
        assert run_coroutine(_where())[1] == loop
    finally:
        WHO.reset(token)


def test_a_load_runs_on_a_fresh_loop_inside_and_outside_a_running_loop() -> None:
    async def app() -> tuple[str, int, int]:
        return run_once(_where)

    outside = run_once(_where)
    inside = asyncio.run(app())
    assert outside[2] == threading.get_ident() and inside[2] != threading.get_ident()


def _desk() -> Agent[Any, Any]:
    agent: Agent[Any, Any] = Agent(TestModel(), name="desk")

    @agent.tool_plain
    async def lookup(order_id: str) -> dict[str, Any]:
        """Look an order up."""
        await asyncio.sleep(0)
        return {"order_id": order_id, "who": WHO.get()}

    return agent


@tool.read
async def ping(ctx: CallContext, text: str) -> dict[str, Any]:
    """Echo, after a turn of the loop."""
    await asyncio.sleep(0)
    return {"text": text}


@function_tool
async def count(text: str) -> int:
    """Count the letters of a text."""
    await asyncio.sleep(0)
    return len(text)


def _ctx(tool: str) -> CallContext:
    return CallContext("run-1", 1, 2, "call_9", tool, "key-9", True, 5.0, CallHTTP({}, 5.0))


def test_agents_and_tools_are_loaded_and_called_inside_a_running_loop() -> None:
    """What an app's `liyagent.client()` does inside FastAPI: it loads the modules that declare
    its agents (a Pydantic AI agent's tools are listed then), and a tool of each kind may be
    called there too (an ad hoc call from an async handler)."""

    async def app() -> tuple[list[str], Any, Any, Any]:
        WHO.set("the app")
        guest = durable(_desk())
        sdk = openai_agents.durable(SdkAgent("sdk", model=ScriptedModel([]), tools=[count]))
        [lookup], [counted] = guest.tools("module m"), sdk.tools("module m")
        return (
            [t.name for t in [lookup, counted]],
            lookup.make({"order_id": "A-1"}, _ctx(lookup.name)),
            counted.make({"text": "four"}, _ctx(counted.name)),
            ping.to_tool("module m").make({"text": "hi"}, _ctx("ping")),
        )

    names, looked_up, counted, pinged = asyncio.run(app())
    assert names == ["desk.lookup", "sdk.count"]
    assert looked_up == {"order_id": "A-1", "who": "the app"}
    assert counted == {"result": 4}
    assert pinged == {"text": "hi"}
