"""`make bench` section `frameworks` (`python -m bench --only frameworks`, or `python -m
bench.framework_step` for the figures alone): what a model step costs through the Pydantic AI
and OpenAI Agents SDK adapters against the native OpenAI provider, each answering one step of
the same conversation (12 messages, one tool) from the same local chat-completions endpoint (a
fixed answer, no latency), in one process; medians of 300 steps (quick 50) after 30 to warm up.
The target (issue 22): an adapter's step within 2 ms of the native provider's.

Figures, so the overhead is told apart from where it comes from: the native provider (JSON
built by hand, one pooled httpx request), the OpenAI SDK alone sending the same body through
the same send-guarded bridge (`sdk_http`), each adapter (conversion, the framework's request
preparation, the SDK), and each conversion alone.
"""

from __future__ import annotations

import json
import os
import statistics
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from agents import Agent as SDKAgent
from agents import OpenAIChatCompletionsModel, function_tool
from openai import AsyncOpenAI
from pydantic_ai import Agent
from pydantic_ai.models.openai import OpenAIChatModel
from pydantic_ai.providers.openai import OpenAIProvider as SDKProvider

from bench.lab import Lab
from bench.report import Figure, Section, Target
from runtime.durable.state import RunState, ToolCall
from runtime.frameworks import openai_agents
from runtime.frameworks.openai_agents_messages import to_input_items
from runtime.frameworks.pydantic_ai import durable
from runtime.frameworks.pydantic_ai_messages import to_model_messages
from runtime.models.base import StepRequest
from runtime.models.openai import OpenAIProvider, to_chat_messages, to_chat_tools
from runtime.models.profiles import ModelProfile
from runtime.models.specs import OpenAISpec
from runtime.toolbox.coroutines import run_coroutine

CALL = {"id": "call_1", "type": "function", "function": {"name": "lookup", "arguments": "{}"}}
ANSWER = json.dumps(
    {
        "id": "bench",
        "object": "chat.completion",
        "created": 0,
        "model": "m",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": None, "tool_calls": [CALL]},
                "finish_reason": "tool_calls",
            }
        ],
    }
).encode()


STEPS = 300
SOURCE = "issue 22"
# An adapter's step may cost this much more than the native provider's.
OVERHEAD_MS = 2.0


class _Endpoint(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers["content-length"]))
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(ANSWER)))
        self.end_headers()
        self.wfile.write(ANSWER)

    def log_message(self, *args: Any) -> None:
        pass


def _median_ms(step: Callable[[], Any], n: int = STEPS) -> float:
    for _ in range(30):
        step()
    times = []
    for _ in range(n):
        start = time.perf_counter()
        step()
        times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times)


def step_costs(steps: int = STEPS) -> dict[str, float]:
    """Median milliseconds per step of each way of asking, by name (the module's doc)."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Endpoint)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_port}/v1"
    os.environ["BENCH_MODEL_KEY"] = "bench"
    model = OpenAIChatModel("m", provider=SDKProvider(base_url=url, api_key="bench"))
    agent: Agent[None, str] = Agent(model, name="bench", instructions="Be brief.")

    @agent.tool_plain
    def lookup(order_id: str) -> dict[str, str]:
        """Look an order up."""
        return {}

    guest = durable(agent, kinds={"lookup": "read"})
    adapter = guest.provider()

    @function_tool
    def sdk_lookup(order_id: str) -> dict[str, str]:
        """Look an order up."""
        return {}

    sdk_lookup.name = "lookup"
    sdk_agent = SDKAgent(
        name="bench",
        instructions="Be brief.",
        model=OpenAIChatCompletionsModel("m", AsyncOpenAI(base_url=url, api_key="bench")),
        tools=[sdk_lookup],
    )
    agents_adapter = openai_agents.durable(sdk_agent, kinds={"lookup": "read"}).provider()
    endpoint = ModelProfile(provider="openai", base_url=url, api_key_env="BENCH_MODEL_KEY")
    native = OpenAIProvider(OpenAISpec(model="m"), endpoint)
    state = RunState.initial("agent", "Be brief.", "help")
    for i in range(5):
        state.take_step(None, [ToolCall(f"c{i}", "bench.lookup", {"order_id": "A"})], 1)
        state.add_results(
            [{"role": "tool", "tool_call_id": f"c{i}", "name": "bench.lookup", "content": "{}"}]
        )
    request = StepRequest("r", 1, 6, list(state.messages), [t.schema() for t in guest.tools("")])
    chat = {"messages": to_chat_messages(request.messages), "tools": to_chat_tools(request.tools)}
    client = adapter.model.client  # type: ignore[attr-defined]
    try:
        return {
            "native provider": _median_ms(lambda: native.next_step(request), steps),
            "OpenAI SDK alone": _median_ms(
                lambda: run_coroutine(client.chat.completions.create(model="m", **chat)), steps
            ),
            "Pydantic AI adapter": _median_ms(lambda: adapter.next_step(request), steps),
            "conversion alone": _median_ms(
                lambda: to_model_messages(request.messages, "bench.", "Be brief."), steps
            ),
            "Agents SDK adapter": _median_ms(lambda: agents_adapter.next_step(request), steps),
            "its conversion alone": _median_ms(
                lambda: to_input_items(request.messages, "bench."), steps
            ),
        }
    finally:
        server.shutdown()
        server.server_close()


def measure_frameworks(lab: Lab, steps: int = STEPS) -> Section:
    """The section: each adapter's step against the native provider's (in this process; the
    lab's servers are not used)."""
    costs = step_costs(steps)
    native = costs["native provider"]
    section = Section(
        "frameworks",
        f"Framework adapters: ms per model step (median of {steps}) vs the native provider",
    )
    keys = {
        "native provider": "native_ms",
        "OpenAI SDK alone": "openai_sdk_ms",
        "Pydantic AI adapter": "pydantic_ai_ms",
        "conversion alone": "pydantic_ai_conversion_ms",
        "Agents SDK adapter": "openai_agents_ms",
        "its conversion alone": "openai_agents_conversion_ms",
    }
    section.figures = [Figure(keys[name], name, ms, "ms") for name, ms in costs.items()]
    for key, name in (("pydantic_ai", "Pydantic AI"), ("openai_agents", "Agents SDK")):
        section.figures.append(
            Figure(
                f"{key}_over_native_ms",
                f"{name} adapter - native provider",
                costs[f"{name} adapter"] - native,
                "ms",
                target=Target("<=", OVERHEAD_MS, SOURCE),
                note=f"of which the OpenAI SDK alone: {costs['OpenAI SDK alone'] - native:.2f} ms",
            )
        )
    section.detail = {"steps": steps, "median_ms": costs}
    return section


def main() -> None:
    costs = step_costs()
    for name, ms in costs.items():
        print(f"{name:>20}: {ms:6.2f} ms per step (median)")
    native, sdk = costs["native provider"], costs["OpenAI SDK alone"]
    for name in ("Pydantic AI adapter", "Agents SDK adapter"):
        over = costs[name] - native
        print(f"{name + ' - native':>30}: {over:6.2f} ms; the OpenAI SDK: {sdk - native:.2f} ms")


if __name__ == "__main__":
    main()
