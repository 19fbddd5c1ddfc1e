"""The OpenAI Agents SDK adapter (runtime/frameworks/openai_agents.py) without a worker: a team's
agent read once into tools of the kinds it declares, the conversation converted to the SDK's
input items, answers turned into calls, a typed final answer or a refusal told to the model;
what it cannot run refused at declaration with a message naming the agent and the feature. The
kinds and readers it is given: tests/unit/frameworks/test_framework_kinds.py, with the other
adapter."""

from __future__ import annotations

from typing import Any

import pytest
from agents import (
    Agent,
    GuardrailFunctionOutput,
    ModelSettings,
    OpenAIChatCompletionsModel,
    OpenAIResponsesModel,
    WebSearchTool,
    function_tool,
    input_guardrail,
    output_guardrail,
)
from agents.mcp import MCPServerStreamableHttp
from agents.models.chatcmpl_converter import Converter
from agents.testing import ScriptedModel, assistant_message, function_call
from openai import AsyncOpenAI
from pydantic import BaseModel

from liyagent.adapters.openai_agents import current_call, durable
from runtime.durable.state import RunState, ToolCall
from runtime.frameworks.openai_agents_messages import to_input_items
from runtime.models.base import StepRequest
from runtime.sending.call_http import CallHTTP
from runtime.toolbox.tools import (
    CallContext,
    InvalidArguments,
    ToolDeclarationError,
    ToolError,
    ToolInDoubt,
    ToolKind,
)


class Answer(BaseModel):
    order_id: str
    refunded_cents: int


@function_tool
def lookup(order_id: str) -> dict[str, str]:
    """Look an order up."""
    if order_id == "none":
        raise LookupError("there is no such order")
    return {"order_id": order_id}


@function_tool
def refund(order_id: str, cents: int) -> str:
    """Refund an order."""
    if cents < 0:
        raise RuntimeError("the card network timed out")
    return f"{current_call().key}:{order_id}:{cents}"


def desk(*steps: Any, **options: Any) -> Agent[Any]:
    options.setdefault("output_type", Answer)
    options.setdefault("tools", [lookup, refund])
    return Agent(
        name="desk",
        instructions="Be brief.",
        model=ScriptedModel([list(s) for s in steps]),
        **options,
    )


def ctx_for(tool: str) -> CallContext:
    return CallContext("run-1", 1, 2, "call_9", tool, "key-9", True, 5.0, CallHTTP({}, 5.0))


def test_a_tool_that_needs_approval_is_an_approval_write() -> None:
    @function_tool(needs_approval=True)
    def wire(amount: int) -> str:
        """Wire money."""
        return "sent"

    guest = durable(desk(tools=[wire]))
    [tool] = guest.tools("here")
    assert tool.kind is ToolKind.APPROVAL_WRITE
    with pytest.raises(ToolDeclarationError, match="needs_approval but is declared 'write'"):
        durable(desk(tools=[wire]), kinds={"wire": "write"})


def test_a_tool_is_called_as_the_sdk_calls_it_its_errors_left_to_liyagent() -> None:
    guest = durable(desk(), kinds={"lookup": "read"})
    tools = {t.name: t for t in guest.tools("here")}
    assert tools["desk.refund"].make({"order_id": "A", "cents": 7}, ctx_for("desk.refund")) == {
        "result": "key-9:A:7"
    }
    with pytest.raises(InvalidArguments, match="cents"):
        tools["desk.refund"].validate({"order_id": "A"})
    with pytest.raises(InvalidArguments, match="extra"):
        tools["desk.refund"].validate({"order_id": "A", "cents": 1, "extra": 2})
    # The SDK's failure function is off: an error is not turned into text for the model, it
    # is liyagent's to settle (a write's, with nothing watched, in doubt).
    with pytest.raises(ToolInDoubt):
        tools["desk.refund"].make({"order_id": "A", "cents": -1}, ctx_for("desk.refund"))
    with pytest.raises((ToolError, ToolInDoubt)):
        tools["desk.lookup"].make({"order_id": "none"}, ctx_for("desk.lookup"))
    # The agent's own tool is untouched: its failure function still answers in the SDK's Runner.
    assert lookup._use_default_failure_error_function


@input_guardrail
def screen(ctx: Any, agent: Any, text: Any) -> GuardrailFunctionOutput:
    return GuardrailFunctionOutput(output_info=None, tripwire_triggered=False)


@output_guardrail
def vet(ctx: Any, agent: Any, output: Any) -> GuardrailFunctionOutput:
    return GuardrailFunctionOutput(output_info=None, tripwire_triggered=False)


@function_tool(timeout=5)
async def slow() -> str:
    """Slow."""
    return "ok"


def _model() -> OpenAIChatCompletionsModel:
    return OpenAIChatCompletionsModel(
        "m", AsyncOpenAI(base_url="http://127.0.0.1:9/v1", api_key="k")
    )


@pytest.mark.parametrize(
    ("options", "said"),
    [
        ({"handoffs": [Agent(name="billing")]}, r"handoffs \(to billing\)"),
        ({"input_guardrails": [screen]}, "guardrails"),
        ({"output_guardrails": [vet]}, "guardrails"),
        (
            {"mcp_servers": [MCPServerStreamableHttp({"url": "http://127.0.0.1:9/mcp"})]},
            "MCP servers.*LIYAGENT_MCP_SERVERS",
        ),
        ({"instructions": lambda ctx, agent: "now"}, "dynamic instructions"),
        ({"model": "gpt-4o"}, "model named by a string"),
        ({"model": None}, "left to the default"),
        ({"model": OpenAIResponsesModel("m", AsyncOpenAI(api_key="k"))}, "OpenAIResponsesModel"),
        ({"tools": [WebSearchTool()]}, "WebSearchTool"),
        ({"tools": [Agent(name="sub").as_tool("sub", "Sub.")]}, "an agent as a tool"),
        ({"tools": [slow]}, "timeout_seconds"),
        ({"tool_use_behavior": "stop_on_first_tool"}, "tool_use_behavior"),
        ({"model_settings": ModelSettings(tool_choice="required")}, "tool_choice"),
    ],
    ids=[
        "handoffs",
        "input-guardrail",
        "output-guardrail",
        "mcp",
        "dynamic-instructions",
        "model-string",
        "model-default",
        "responses-model",
        "hosted-tool",
        "agent-tool",
        "tool-timeout",
        "tool-use-behavior",
        "tool-choice",
    ],
)
def test_an_unsupported_feature_is_refused_naming_it(options: dict[str, Any], said: str) -> None:
    options.setdefault("model", _model())
    with pytest.raises(ToolDeclarationError, match=f"openai-agents agent a: .*{said}"):
        durable(Agent(name="a", **options))


def test_the_conversation_converts_with_tool_names_mapped_back() -> None:
    state = RunState.initial("agent", None, "help")
    state.take_step("looking", [ToolCall("c1", "desk.lookup", {"order_id": "A"})], 1)
    state.add_results(
        [{"role": "tool", "tool_call_id": "c1", "name": "desk.lookup", "content": '{"a": 1}'}]
    )
    state.take_refused("not json", [], "the answer does not fit its type: x", 1)
    chat = Converter.items_to_messages(to_input_items(state.messages, "desk."))
    assert [m["role"] for m in chat] == ["user", "assistant", "tool", "assistant", "user"]
    assert chat[1]["content"] == "looking"
    assert chat[1]["tool_calls"][0]["function"] == {
        "name": "lookup",
        "arguments": '{"order_id": "A"}',
    }
    assert chat[2] == {"role": "tool", "tool_call_id": "c1", "content": '{"a": 1}'}
    assert chat[4]["content"] == "the answer does not fit its type: x"


def _step(agent: Agent[Any]) -> Any:
    provider = durable(agent).provider()
    return provider.next_step(StepRequest("run-1", 1, 1, [{"role": "user", "content": "hi"}], []))


def test_a_typed_final_answer_fits_or_is_refused() -> None:
    good = _step(desk([assistant_message('{"order_id": "A", "refunded_cents": 5}')]))
    assert good.final and good.output.value == {"order_id": "A", "refunded_cents": 5}
    bad = _step(desk([assistant_message('{"order_id": "A", "refunded_cents": "x"}')]))
    assert not bad.final and "refunded_cents" in bad.refused and "does not fit" in bad.refused
    assert bad.calls == []
    scalar = _step(desk([assistant_message('{"response": 3}')], output_type=int))
    assert scalar.output.value == 3
    union = desk([assistant_message('{"response": "three"}')], output_type=int | str)
    assert _step(union).output.value == "three"


def test_a_plain_agent_answers_text_and_calls_by_registry_name() -> None:
    agent = desk([function_call("lookup", {"order_id": "A"}, call_id="c1")], output_type=None)
    assert _step(agent).calls == [ToolCall("c1", "desk.lookup", {"order_id": "A"})]
    broken = _step(desk([function_call("lookup", "{not json", call_id="c1")], output_type=None))
    assert broken.calls[0].args_error and broken.calls[0].raw_args == "{not json"
    final = _step(desk([assistant_message("Done.")], output_type=None))
    assert final.final and final.text == "Done." and final.output is None


def test_each_step_sends_the_instructions_tools_and_who_asks() -> None:
    agent = desk([assistant_message("Done.")], output_type=None)
    _step(agent)
    assert isinstance(agent.model, ScriptedModel)
    call = agent.model.last_call
    assert call is not None and call.system_instructions == "Be brief."
    assert call.model_settings.extra_headers == {
        "X-Liyagent-Run": "run-1",
        "X-Liyagent-Attempt": "1",
        "X-Liyagent-Step": "1",
    }
    assert [t.name for t in call.tools] == ["lookup", "refund"]  # type: ignore[union-attr]
    assert call.handoffs == [] and call.previous_response_id is None


def test_an_openai_model_is_rebuilt_through_the_send_guard_without_retries() -> None:
    model = _model()
    provider = durable(Agent(name="a", model=model)).provider()
    assert provider.model is not model
    rebuilt = provider.model
    assert isinstance(rebuilt, OpenAIChatCompletionsModel)
    assert rebuilt._client.max_retries == 0 and rebuilt.model == "m"
    assert str(rebuilt._client.base_url).startswith("http://127.0.0.1:9/v1")


def test_a_disabled_tool_is_left_out_and_an_output_schema_is_taken_as_it_is() -> None:
    from agents import AgentOutputSchema

    @function_tool(is_enabled=False)
    def hidden() -> str:
        """Hidden."""
        return "no"

    guest = durable(desk(tools=[lookup, hidden], output_type=AgentOutputSchema(Answer)))
    assert [t.name for t in guest.tools("here")] == ["desk.lookup"]
    assert guest.output is not None and guest.output.name() == "Answer"
