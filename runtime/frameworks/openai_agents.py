"""A team's OpenAI Agents SDK `agents.Agent` run durably on liyagent's own loop
(`runtime/core/agent.py`).

The agent's code is kept: its model answers each step (one `Model.get_response` of its
`OpenAIChatCompletionsModel`, the SDK's own conversion of the conversation, its function
tools' schemas and its output type's `response_format`; its `AsyncOpenAI` client copied over
the send guard with its own retries off); its `@function_tool` tools become liyagent tools of
the kinds the team declares (`kinds={...}`, a write when none), each called as the SDK calls
it (`on_invoke_tool`: the SDK parses and validates the arguments), with its failure function
off, so an error is liyagent's to settle by the tool's kind, never turned into text for the
model. Checkpoints, seals, step keys, marks and settlement are the native agents' code.

Why not the SDK's `Runner` (nor the Temporal integration, which runs the Runner inside a
workflow and makes each model call and tool an activity, replayed deterministically): the
Runner is a loop of its own, running tools itself. liyagent does not replay code; it seals
what each step added and resumes from the last record, so its loop must stay the loop for a
resume to ask only the steps after it (I5) and settle each call left in doubt by its kind
(I2). The agent is read once, when the module is loaded: what a run would need and this
adapter does not support (handoffs, guardrails, MCP servers, hooks, dynamic instructions,
...) is refused then, naming the agent and the feature.
"""

from __future__ import annotations

import copy
import dataclasses
import json
from collections.abc import Callable, Mapping
from typing import Any, ClassVar

import openai
import pydantic
from agents import Agent, FunctionTool, OpenAIChatCompletionsModel
from agents.agent_output import AgentOutputSchema, AgentOutputSchemaBase
from agents.exceptions import AgentsException, ModelBehaviorError
from agents.items import ModelResponse
from agents.models.interface import Model, ModelTracing
from agents.testing import ScriptedModel
from agents.tool import set_function_tool_failure_error_function
from agents.tool_context import ToolContext
from jsonschema.validators import validator_for
from openai.types.responses import (
    ResponseFunctionToolCall,
    ResponseOutputMessage,
    ResponseOutputRefusal,
    ResponseOutputText,
)
from pydantic_core import to_jsonable_python

from runtime.base.validation import described
from runtime.durable.policy import Policy
from runtime.durable.state import ToolCall
from runtime.frameworks import calls as shared
from runtime.frameworks.calls import CallTransport, current_call
from runtime.frameworks.openai_agents_messages import to_input_items, usage_of
from runtime.models.base import ModelProvider, StepAnswer, StepRequest, Typed
from runtime.models.openai import read_arguments
from runtime.models.output import OutputType, OutputTypeError
from runtime.sending import sdk_http
from runtime.toolbox.coroutines import run_coroutine
from runtime.toolbox.guests import GuestAgent, guest_tool_name
from runtime.toolbox.tools import (
    CallContext,
    InvalidArguments,
    Outcome,
    Tool,
    ToolDeclarationError,
    ToolError,
    ToolKind,
)
from runtime.toolbox.typed_tools import as_outcome, declared_policy

FRAMEWORK = "openai-agents"
MODEL_TIMEOUT_S = 60.0


def _who(agent: str) -> str:
    return f"{FRAMEWORK} agent {agent}"


def _refuse(agent: str, feature: str, instead: str) -> ToolDeclarationError:
    return shared.refused(_who(agent), feature, instead)


def _check_agent(agent: Agent[Any], name: str) -> None:
    """Refuse, naming it, what a run would need and the adapter does not do."""
    if agent.handoffs:
        targets = ", ".join(
            str(getattr(h, "agent_name", None) or getattr(h, "name", h)) for h in agent.handoffs
        )
        raise _refuse(
            name,
            f"handoffs (to {targets})",
            "run one agent per liyagent run: register each agent with durable(...) and start "
            "the other's run from a tool (liyagent.start_agent), or give its work as tools",
        )
    if agent.input_guardrails or agent.output_guardrails:
        raise _refuse(
            name,
            "input and output guardrails",
            "check the input before start_agent, and put an answer's checks in its output type",
        )
    if agent.mcp_servers:
        raise _refuse(
            name,
            "MCP servers (mcp_servers)",
            "serve the server's tools with LIYAGENT_MCP_SERVERS (a kind per tool, the step key "
            "sent in _meta) and drop them from the agent",
        )
    if agent.hooks is not None:
        raise _refuse(name, "agent hooks", "read the run's events instead")
    if agent.prompt is not None:
        raise _refuse(name, "a stored prompt (prompt=)", "give the instructions as text")
    if agent.instructions is not None and not isinstance(agent.instructions, str):
        raise _refuse(
            name,
            "dynamic instructions (a function)",
            "give the instructions as text (a function's result would not be in the sealed record)",
        )
    if agent.tool_use_behavior != "run_llm_again":
        raise _refuse(
            name,
            f"tool_use_behavior {agent.tool_use_behavior!r}",
            "leave it run_llm_again: the model answers after each tool's result",
        )
    if agent.model_settings.tool_choice is not None:
        raise _refuse(
            name,
            f"model_settings.tool_choice {agent.model_settings.tool_choice!r}",
            "leave it unset (the SDK's Runner resets it after a tool call; liyagent's loop "
            "sends the settings as they are)",
        )


def _model_of(agent: Agent[Any], name: str) -> Model:
    model = agent.model
    if not isinstance(model, Model):
        raise _refuse(
            name,
            f"a model named by a string or left to the default ({model!r})",
            "give the agent a model object: OpenAIChatCompletionsModel(model=..., "
            "openai_client=AsyncOpenAI(base_url=..., api_key=...))",
        )
    if not isinstance(model, OpenAIChatCompletionsModel | ScriptedModel):
        raise _refuse(
            name,
            f"model {type(model).__name__}",
            "use OpenAIChatCompletionsModel (any OpenAI-compatible endpoint): its HTTP is what "
            "liyagent passes through its send guard",
        )
    return model


def _output(agent: Agent[Any], name: str) -> AgentOutputSchemaBase | None:
    """The declared output type's schema (the SDK's own); None for text output."""
    output_type = agent.output_type
    if output_type is None or output_type is str:
        return None
    if isinstance(output_type, AgentOutputSchemaBase):
        schema = output_type
    else:
        try:
            schema = AgentOutputSchema(output_type)
        except AgentsException as exc:
            raise _refuse(
                name, f"output type {output_type!r} ({exc})", "declare one type"
            ) from None
    return None if schema.is_plain_text() else schema


def _read_as(schema: AgentOutputSchemaBase | None) -> OutputType | None:
    """The declared type an app reads the answer as; None for text, or for a custom
    `AgentOutputSchemaBase`, which has no Python type (its answer is read as JSON)."""
    if not isinstance(schema, AgentOutputSchema):
        return None
    try:
        return OutputType.of(schema.output_type)
    except OutputTypeError:
        return None


def _function_tools(agent: Agent[Any], name: str) -> dict[str, FunctionTool]:
    """Its enabled function tools by name; any other kind of tool refused."""
    found: dict[str, FunctionTool] = {}
    for tool in agent.tools:
        if not isinstance(tool, FunctionTool):
            raise _refuse(
                name,
                f"tool {getattr(tool, 'name', type(tool).__name__)} ({type(tool).__name__}; "
                "hosted and computer tools among them)",
                "declare it as a @function_tool",
            )
        if getattr(tool, "_is_agent_tool", False) or getattr(tool, "_is_codex_tool", False):
            raise _refuse(
                name,
                f"tool {tool.name} (an agent as a tool)",
                "register that agent with durable(...) and start its run from a tool",
            )
        if tool.is_enabled is False:
            continue
        if tool.is_enabled is not True:
            raise _refuse(name, f"tool {tool.name}'s is_enabled function", "enable it or drop it")
        if tool.tool_input_guardrails or tool.tool_output_guardrails:
            raise _refuse(name, f"tool {tool.name}'s guardrails", "check inside the tool body")
        if tool.timeout_seconds is not None:
            raise _refuse(
                name,
                f"tool {tool.name}'s timeout_seconds",
                "set the timeout on the tool's own client (a write cut short is in doubt "
                "either way)",
            )
        if tool.needs_approval not in (True, False):
            raise _refuse(
                name,
                f"tool {tool.name}'s needs_approval function",
                'declare the tool "approval_write" in kinds (every call held for a person)',
            )
        found[tool.name] = tool
    return found


class OpenAIAgentsAgent(GuestAgent):
    """One registered `agents.Agent`: its tools, its provider, its output type."""

    framework: ClassVar[str] = FRAMEWORK

    def __init__(
        self,
        agent: Agent[Any],
        *,
        name: str,
        kinds: Mapping[str, str] | None = None,
        readers: Mapping[str, Callable[..., Any]] | None = None,
        definition_policy: Policy = Policy.PINNED,
    ) -> None:
        super().__init__(name, definition_policy)
        _check_agent(agent, name)
        self.agent = agent
        self.instructions = agent.instructions if isinstance(agent.instructions, str) else None
        self.model = _model_of(agent, name)
        self.output = _output(agent, name)
        self._output_type = _read_as(self.output)
        self.defs = _function_tools(agent, name)
        shared.check_named(_who(name), self.defs, {"kinds": kinds, "readers": readers})
        self.kinds = {t: self._kind_of(t, (kinds or {}).get(t)) for t in self.defs}
        self.readers = dict(readers or {})
        self._tools = [self._tool(t) for t in self.defs]
        self._providers = shared.PerThread(lambda: OpenAIAgentsProvider(self, guarded(self.model)))

    def model_name(self) -> str | None:
        """The model the agent's code asks (its model object's name, when it has one)."""
        named = getattr(self.model, "model", None)
        return named if isinstance(named, str) else None

    def _kind_of(self, tool: str, declared: str | None) -> tuple[ToolKind, float | None]:
        """The declared kind; a tool that `needs_approval` is an approval write (the SDK's
        approval becomes liyagent's), and a kind that says otherwise is refused."""
        held = self.defs[tool].needs_approval is True
        return shared.declared_kind(
            _who(self.name), tool, declared, held=held, approval="needs_approval"
        )

    def _tool(self, tool_name: str) -> Tool:
        kind, window = self.kinds[tool_name]
        definition = self.defs[tool_name]
        registry_name = guest_tool_name(self.name, tool_name)
        schema = dict(definition.params_json_schema)
        checker = validator_for(schema)(schema)
        # The SDK's invoker with its failure function off: what the body raises is raised.
        strict = copy.copy(definition)
        set_function_tool_failure_error_function(strict, None)

        def validate(args: dict[str, Any]) -> dict[str, Any]:
            found = [
                {
                    "field": "/".join(str(p) for p in e.absolute_path) or "(arguments)",
                    "message": e.message,
                }
                for e in sorted(checker.iter_errors(args), key=lambda e: list(e.absolute_path))
            ]
            if found:
                raise InvalidArguments(registry_name, found)
            return args

        def invoke(args: dict[str, Any], ctx: CallContext) -> Outcome:
            checked = validate(args)
            # The lease, just before, whatever kind the registry gives the tool now (a
            # LIYAGENT_TOOL_KINDS override may make a read a write): the body may send with a
            # client the guard does not see, and from here a failure is in doubt (a read's is
            # only said: making it again is harmless).
            ctx.check_send()
            text = json.dumps(checked)
            tool_ctx = ToolContext[None](
                context=None, tool_name=tool_name, tool_call_id=ctx.call_id, tool_arguments=text
            )
            try:
                with shared.in_call(ctx):
                    result = run_coroutine(strict.on_invoke_tool(tool_ctx, text))
            except ModelBehaviorError as exc:  # its arguments refused before the body ran
                raise ToolError(str(exc)) from exc
            return as_outcome(result)

        return Tool(
            name=registry_name,
            kind=kind,
            reader=shared.write_reader(
                _who(self.name), tool_name, kind, self.readers, registry_name
            ),
            description=definition.description or tool_name,
            invoke=invoke,
            dedupe_window_s=window,
            parameters=schema,
            validate=validate,
            origin=_who(self.name),
        )

    def tools(self, origin: str) -> list[Tool]:
        return list(self._tools)

    def provider(self) -> ModelProvider:
        """One per process and thread (each thread runs its own event loop)."""
        return self._providers.get()

    def output_type(self) -> OutputType | None:
        return self._output_type


def guarded(model: Model) -> Model:
    """The agent's model with its `AsyncOpenAI` client's HTTP through the send guard, its own
    retries off (the engine decides when to ask again): the same model name, endpoint and key.
    A model that makes no HTTP (the SDK's `ScriptedModel`) is used as it is."""
    if not isinstance(model, OpenAIChatCompletionsModel):
        return model
    client = shared.plain_chat_body(
        model._client.copy(http_client=sdk_http.async_client(MODEL_TIMEOUT_S), max_retries=0)
    )
    return OpenAIChatCompletionsModel(
        model=model.model,
        openai_client=client,
        should_replay_reasoning_content=model.should_replay_reasoning_content,
    )


class OpenAIAgentsProvider:
    """Answers each step with one request to the agent's own model."""

    name = FRAMEWORK

    def __init__(self, guest: OpenAIAgentsAgent, model: Model) -> None:
        self.guest = guest
        self.model = model
        self.prefix = f"{guest.name}."
        self.tools: list[Any] = list(guest.defs.values())
        # The SDK's own retry policy is the Runner's; the engine decides here.
        self.settings = dataclasses.replace(guest.agent.model_settings, retry=None)
        # What each request sends beyond the step's messages and instructions, and the model
        # it asks, for the reservation noted before it (runtime/core/ledger.py).
        output = None if guest.output is None else guest.output.json_schema()
        self.prompt_fixed: list[Any] = [self.tools, output]
        named = getattr(model, "model", None)
        self.model_name = named if isinstance(named, str) else None

    def next_step(self, request: StepRequest) -> StepAnswer:
        settings = dataclasses.replace(
            self.settings,
            extra_headers={**(self.settings.extra_headers or {}), **request.headers()},
        )
        try:
            response = run_coroutine(
                self.model.get_response(
                    system_instructions=self.guest.instructions_for(request),
                    input=to_input_items(request.messages, self.prefix),
                    model_settings=settings,
                    tools=self.tools,
                    output_schema=self.guest.output,
                    handoffs=[],
                    tracing=ModelTracing.DISABLED,
                    previous_response_id=None,
                    conversation_id=None,
                    prompt=None,
                )
            )
        except openai.APIStatusError as exc:
            raise shared.model_error(request.run_id, exc) from exc
        except (openai.APIError, AgentsException) as exc:
            refused = shared.send_refused(exc)
            if refused is not None:
                raise refused from None  # the attempt stops; asking again cannot help
            # No response (timeout, lost connection: asked again) or an answer the SDK could
            # not use (ModelBehaviorError, a body it could not validate: not asked again).
            raise shared.model_error(request.run_id, exc) from exc
        # Its usage reaches the step's write with the answer (store/usage.py).
        asked = getattr(self.model, "model", None)
        used = usage_of(response, asked if isinstance(asked, str) else None)
        return dataclasses.replace(self.answer(response), usage=used)

    def answer(self, response: ModelResponse) -> StepAnswer:
        """The step's answer from the model's output items: calls, a final text, a typed final
        answer, or a final answer refused for its type (the model is then told why)."""
        texts: list[str] = []
        refusals: list[str] = []
        found: list[ToolCall] = []
        for item in response.output:
            if isinstance(item, ResponseOutputMessage):
                for part in item.content:
                    if isinstance(part, ResponseOutputText):
                        texts.append(part.text)
                    elif isinstance(part, ResponseOutputRefusal):
                        refusals.append(part.refusal)
            elif isinstance(item, ResponseFunctionToolCall):
                found.append(self._call(item))
        text = "".join(texts) or None
        if found or self.guest.output is None:
            return StepAnswer(text=text or ("\n".join(refusals) or None), calls=found)
        if text is None:
            said = "; ".join(refusals) or "no text"
            return StepAnswer(
                text=None, calls=[], refused=f"a final answer is JSON of its type ({said})"
            )
        try:
            value = validated(self.guest.output, text)
        except ValueError as exc:
            return StepAnswer(
                text=text, calls=[], refused=f"the answer does not fit its type: {exc}"
            )
        plain = to_jsonable_python(value)
        return StepAnswer(text=json.dumps(plain, sort_keys=True), calls=[], output=Typed(plain))

    def _call(self, item: ResponseFunctionToolCall) -> ToolCall:
        name = self.prefix + item.name
        raw = item.arguments
        # Arguments that are not a JSON object: the call is not made, the model is told (as for
        # arguments that fail their schema), the raw text given back as it was.
        args, error = read_arguments(raw) if raw and raw.strip() else ({}, None)
        if error is not None:
            return ToolCall(item.call_id, name, {}, args_error=error, raw_args=raw)
        return ToolCall(item.call_id, name, args or {})


def validated(schema: AgentOutputSchemaBase, text: str) -> Any:
    """The answer's value as the SDK validates it; raises ValueError saying what does not fit
    (field by field for the SDK's own schema: its error redacts the model's data)."""
    if isinstance(schema, AgentOutputSchema):
        adapter: pydantic.TypeAdapter[Any] = schema._type_adapter
        try:
            value = adapter.validate_json(text, strict=schema.is_strict_json_schema() or None)
        except pydantic.ValidationError as exc:
            raise ValueError(described(exc, "(answer)")) from None
        if schema._is_wrapped:
            if not isinstance(value, dict) or "response" not in value:
                raise ValueError("the answer is an object with its value in response")
            return value["response"]
        return value
    try:
        return schema.validate_json(text)
    except ModelBehaviorError as exc:
        raise ValueError(str(exc)) from None


def durable(
    agent: Agent[Any],
    *,
    name: str | None = None,
    kinds: Mapping[str, str] | None = None,
    readers: Mapping[str, Callable[..., Any]] | None = None,
    definition_policy: str = "pinned",
) -> OpenAIAgentsAgent:
    """Register an `agents.Agent` to run on liyagent (hold the result at the top level of a
    module LIYAGENT_TOOLS names); `kinds` maps each tool to `read`, `write`, `approval_write`
    or `keyed_write:<seconds>` (a tool not named is a write, or an approval write when it
    `needs_approval`); `readers` maps a write to the function that finds its outcome by the
    call's key after a crash (the `CallContext` first, then the write's arguments; None when
    it finds none); `definition_policy` what its runs do when a worker's code no longer serves
    the definition they started with ("pinned": wait for one that does; "follow_latest")."""
    chosen = name or agent.name
    if not chosen:
        raise ToolDeclarationError("durable(agent): give the agent a name (name=...)")
    policy = declared_policy(chosen, definition_policy)
    return OpenAIAgentsAgent(
        agent, name=chosen, kinds=kinds, readers=readers, definition_policy=policy
    )


__all__ = ["CallTransport", "OpenAIAgentsAgent", "current_call", "durable"]
