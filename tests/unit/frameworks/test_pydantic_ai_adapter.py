"""The Pydantic AI adapter (runtime/frameworks/pydantic_ai.py) without a worker: a team's agent
read once into tools of the kinds it declares, conversations converted both ways, answers
turned into calls, a typed final answer or a refusal told to the model; what it cannot run
refused at declaration with a message naming the agent and the feature. The kinds and readers
it is given: tests/unit/frameworks/test_framework_kinds.py, with the other adapter."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import BaseModel
from pydantic_ai import Agent, ModelRetry, RunContext, messages
from pydantic_ai.capabilities.process_history import ProcessHistory
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.models.openai import OpenAIChatModel
from pydantic_ai.models.test import TestModel
from pydantic_ai.providers.openai import OpenAIProvider
from pydantic_ai.toolsets import AbstractToolset

from liyagent.adapters.pydantic_ai import current_call, durable
from runtime.durable.state import RunState, ToolCall
from runtime.frameworks.pydantic_ai import OUTPUT_TOOL
from runtime.frameworks.pydantic_ai_messages import to_model_messages
from runtime.models.base import StepRequest
from runtime.sending import traffic
from runtime.sending.call_http import CallHTTP
from runtime.toolbox.tools import (
    CallContext,
    InvalidArguments,
    ToolDeclarationError,
    ToolError,
    ToolKind,
)


class Answer(BaseModel):
    order_id: str
    refunded_cents: int


def desk(output_type: Any = Answer, **options: Any) -> Agent[Any, Any]:
    agent: Agent[Any, Any] = Agent(
        TestModel(), name="desk", output_type=output_type, instructions="Be brief.", **options
    )

    @agent.tool_plain
    def lookup(order_id: str) -> dict[str, str]:
        """Look an order up."""
        if order_id == "none":
            raise ModelRetry("there is no such order")
        return {"order_id": order_id}

    @agent.tool
    def refund(ctx: RunContext[None], order_id: str, cents: int) -> str:
        """Refund an order."""
        return f"{ctx.tool_call_id}:{current_call().key}:{cents}"

    return agent


def ctx_for(tool: str) -> CallContext:
    return CallContext("run-1", 1, 2, "call_9", tool, "key-9", True, 5.0, CallHTTP({}, 5.0))


def test_a_tool_is_called_as_pydantic_ai_calls_it() -> None:
    guest = durable(desk(), kinds={"lookup": "read"})
    tools = {t.name: t for t in guest.tools("here")}
    # Arguments validated (and coerced) by the tool's own validator; the call's key reachable.
    assert tools["desk.refund"].make({"order_id": "A", "cents": "7"}, ctx_for("desk.refund")) == {
        "result": "call_9:key-9:7"
    }
    with pytest.raises(InvalidArguments, match="cents"):
        tools["desk.refund"].make({"order_id": "A"}, ctx_for("desk.refund"))
    # ModelRetry is a definite refusal the model is told.
    with pytest.raises(ToolError, match="no such order"):
        tools["desk.lookup"].make({"order_id": "none"}, ctx_for("desk.lookup"))


class Deps(BaseModel):
    db: str


class Remote(AbstractToolset[Any]):
    @property
    def id(self) -> str:
        return "remote"

    async def get_tools(self, ctx: RunContext[Any]) -> dict[str, Any]:
        return {}

    async def call_tool(self, name: str, tool_args: dict[str, Any], ctx: Any, tool: Any) -> Any:
        return None


def _dynamic(ctx: RunContext[None]) -> str:
    return "now"


@pytest.mark.parametrize(
    ("make", "said"),
    [
        (lambda: Agent(TestModel(), name="a", deps_type=Deps), r"deps \(Deps\)"),
        (lambda: Agent(TestModel(), name="a", instructions=_dynamic), "dynamic instructions"),
        (lambda: Agent("openai:gpt-4o", name="a", defer_model_check=True), "model named by"),
        (lambda: Agent(TestModel(), name="a", toolsets=[Remote()]), "toolset Remote"),
        (
            lambda: Agent(TestModel(), name="a", capabilities=[ProcessHistory(lambda m: m)]),
            "history processors",
        ),
        (lambda: Agent(TestModel(), name="a", output_type=[int, str]), "output type"),
    ],
    ids=["deps", "dynamic-instructions", "model-string", "mcp-toolset", "history", "output"],
)
def test_an_unsupported_feature_is_refused_naming_it(make: Any, said: str) -> None:
    with pytest.raises(ToolDeclarationError, match=f"pydantic-ai agent a: .*{said}"):
        durable(make())


def test_an_output_validator_and_a_nameless_agent_are_refused() -> None:
    agent = desk()

    @agent.output_validator
    def check(value: Answer) -> Answer:
        return value

    with pytest.raises(ToolDeclarationError, match="output validator"):
        durable(agent)
    with pytest.raises(ToolDeclarationError, match="give the agent a name"):
        durable(Agent(TestModel()))


def test_the_conversation_converts_with_tool_names_mapped_back() -> None:
    state = RunState.initial("agent", "You are the desk.", "help")
    state.take_step("looking", [ToolCall("c1", "desk.lookup", {"order_id": "A"})], 1)
    state.add_results(
        [{"role": "tool", "tool_call_id": "c1", "name": "desk.lookup", "content": '{"a": 1}'}]
    )
    state.take_refused(None, [ToolCall("c2", OUTPUT_TOOL, {"x": 1})], "does not fit", 1)
    out = to_model_messages(state.messages, "desk.", "Be brief.")
    assert [type(m).__name__ for m in out] == [
        "ModelRequest",
        "ModelResponse",
        "ModelRequest",
        "ModelResponse",
        "ModelRequest",
    ]
    assert isinstance(out[0].parts[0], messages.SystemPromptPart)
    call = out[1].parts[1]
    assert isinstance(call, messages.ToolCallPart) and call.tool_name == "lookup"
    back = out[2].parts[0]
    assert isinstance(back, messages.ToolReturnPart) and back.content == {"a": 1}
    retry = out[4].parts[0]
    assert isinstance(retry, messages.ToolReturnPart) and retry.outcome == "retried"
    assert retry.tool_name == OUTPUT_TOOL and retry.content["error"] == "does not fit"
    text = RunState.initial("agent", None, "help")
    text.take_refused("plain text", [], "answer with the output tool", 1)
    [feedback] = to_model_messages(text.messages, "desk.", None)[-1].parts
    assert isinstance(feedback, messages.RetryFeedbackPart)
    assert out[4].instructions == "Be brief."


def _answering(*parts: messages.ModelResponsePart) -> FunctionModel:
    def respond(history: list[messages.ModelMessage], info: AgentInfo) -> messages.ModelResponse:
        return messages.ModelResponse(parts=list(parts))

    return FunctionModel(respond)


def _step(agent: Agent[Any, Any]) -> Any:
    provider = durable(agent).provider()
    request = StepRequest("run-1", 1, 1, [{"role": "user", "content": "hi"}], [])
    return provider.next_step(request)


def test_a_typed_final_answer_fits_or_is_refused() -> None:
    good = messages.ToolCallPart(OUTPUT_TOOL, {"order_id": "A", "refunded_cents": 5}, "c1")
    answer = _step(Agent(_answering(good), name="a", output_type=Answer))
    assert answer.final and answer.output.value == {"order_id": "A", "refunded_cents": 5}
    bad = messages.ToolCallPart(OUTPUT_TOOL, {"order_id": "A", "refunded_cents": "x"}, "c1")
    refused = _step(Agent(_answering(bad), name="a", output_type=Answer))
    assert not refused.final and "refunded_cents" in refused.refused
    assert [c.name for c in refused.calls] == [OUTPUT_TOOL]
    text = _step(Agent(_answering(messages.TextPart("done")), name="a", output_type=Answer))
    assert f"calling {OUTPUT_TOOL}" in text.refused
    scalar = messages.ToolCallPart(OUTPUT_TOOL, {"response": 3}, "c1")
    assert _step(Agent(_answering(scalar), name="a", output_type=int)).output.value == 3
    either = messages.ToolCallPart(OUTPUT_TOOL, {"response": "three"}, "c1")
    union = Agent(_answering(either), name="a", output_type=int | str)  # type: ignore[arg-type]
    assert _step(union).output.value == "three"


def test_a_plain_agent_answers_text_and_calls_by_registry_name() -> None:
    agent: Agent[Any, Any] = Agent(
        _answering(messages.ToolCallPart("lookup", '{"order_id": "A"}', "c1")), name="a"
    )

    @agent.tool_plain
    def lookup(order_id: str) -> str:
        """Look up."""
        return order_id

    answer = _step(agent)
    assert answer.calls == [ToolCall("c1", "a.lookup", {"order_id": "A"})]
    broken = _step(Agent(_answering(messages.ToolCallPart("lookup", "{not json", "c1")), name="a"))
    assert broken.calls[0].args_error and broken.calls[0].raw_args == "{not json"
    final = _step(Agent(_answering(messages.TextPart("Done.")), name="a"))
    assert final.final and final.text == "Done." and final.output is None


def test_an_openai_model_is_rebuilt_through_the_send_guard_without_retries() -> None:
    model = OpenAIChatModel(
        "m", provider=OpenAIProvider(base_url="http://127.0.0.1:9/v1", api_key="k")
    )
    provider = durable(Agent(model, name="a")).provider()
    assert provider.model is not model
    assert provider.model.client.max_retries == 0
    assert provider.model.model_name == "m"
    assert str(provider.model.client.base_url).startswith("http://127.0.0.1:9/v1")


def test_the_call_transport_hands_back_a_decoded_body() -> None:
    import gzip

    import httpx

    from runtime.frameworks.pydantic_ai import _decoded

    raw = httpx.Response(
        200,
        headers={"content-encoding": "gzip", "x-vendor": "desk"},
        content=gzip.compress(b'{"ok": true}'),
    )
    raw.read()
    out = _decoded(raw)
    assert out.json() == {"ok": True} and out.headers["x-vendor"] == "desk"
    assert "content-encoding" not in out.headers


def test_a_tool_timeout_is_refused() -> None:
    """Pydantic AI turns a tool timeout into ModelRetry: a write cut off by one would be told to
    the model as a retry while its request may have left."""
    with pytest.raises(ToolDeclarationError, match="pydantic-ai agent a: a tool timeout"):
        durable(Agent(TestModel(), name="a", tool_timeout=5))
    agent: Agent[None, str] = Agent(TestModel(), name="a")

    @agent.tool_plain(timeout=3)
    def slow() -> str:
        """Slow."""
        return "done"

    with pytest.raises(ToolDeclarationError, match="tool slow's timeout"):
        durable(agent)


def test_a_tool_that_requires_approval_is_an_approval_write() -> None:
    agent: Agent[None, str] = Agent(TestModel(), name="a")

    @agent.tool_plain(requires_approval=True)
    def send_money(cents: int) -> str:
        """Send money."""
        return "sent"

    tools = {t.name: t for t in durable(agent).tools("here")}
    assert tools["a.send_money"].kind is ToolKind.APPROVAL_WRITE
    with pytest.raises(ToolDeclarationError, match="requires_approval but is declared 'write'"):
        durable(agent, kinds={"send_money": "write"})


def test_a_tools_own_args_validator_runs_before_anything_is_sent() -> None:
    agent: Agent[None, str] = Agent(TestModel(), name="a")
    sent: list[int] = []

    def positive(ctx: RunContext[None], cents: int) -> None:
        if cents <= 0:
            raise ModelRetry("cents must be positive")

    @agent.tool_plain(args_validator=positive)
    def refund(cents: int) -> str:
        """Refund."""
        sent.append(cents)
        return "ok"

    [tool] = durable(agent, kinds={"refund": "write"}).tools("here")
    with traffic.watched() as seen, pytest.raises(ToolError, match="cents must be positive"):
        tool.make({"cents": 0}, ctx_for("a.refund"))
    assert sent == [] and not seen.left  # failed for certain: nothing may have left
    assert tool.make({"cents": 5}, ctx_for("a.refund")) == {"result": "ok"}
    assert sent == [5]
