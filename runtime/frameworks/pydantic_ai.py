"""A team's `pydantic_ai.Agent` run durably on liyagent's own loop (`runtime/core/agent.py`).

The agent's code is kept: its model answers each step (one request through
`pydantic_ai.direct.model_request`, the agent's tool definitions and output tool in its
`ModelRequestParameters`, its OpenAI client's HTTP through the send guard); its function tools
become liyagent tools of the kinds the team declares (`kinds={...}`, a write when none), each
called as Pydantic AI calls it (arguments validated by its own validator, `ModelRetry` told to
the model). Checkpoints, seals, step keys, marks and settlement are the native agents' code.

Why an adapter the engine drives, not a durability capability (`TemporalDurability`,
`DBOSDurability`): those keep Pydantic AI's graph as the loop and replay it deterministically
over recorded activities. liyagent does not replay code; it seals what each step added and
resumes from the last record, so its loop must stay the loop for a resume to ask only the
steps after it (I5) and settle each call left in doubt by its kind (I2). The agent is read
once, when the module is loaded: what it would need that this adapter does not support is
refused then, naming the feature.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from dataclasses import replace
from functools import partial
from typing import Any, ClassVar, cast

import pydantic
from pydantic_ai import Agent, direct, exceptions, messages
from pydantic_ai.capabilities.abstract import leaf_capabilities
from pydantic_ai.models import Model, ModelRequestParameters
from pydantic_ai.tools import RunContext, ToolDefinition
from pydantic_ai.toolsets import AbstractToolset, FunctionToolset
from pydantic_ai.usage import RunUsage

from runtime.base.validation import problems
from runtime.durable.policy import Policy
from runtime.durable.state import ToolCall
from runtime.frameworks import calls as shared
from runtime.frameworks import pydantic_ai_mcp as mcp
from runtime.frameworks.calls import CallTransport, current_call, decoded
from runtime.frameworks.pydantic_ai_messages import to_model_messages, usage_of
from runtime.models.base import ModelProvider, StepAnswer, StepRequest
from runtime.models.openai import read_arguments
from runtime.models.output import (
    OUTPUT_DESCRIPTION,
    OUTPUT_TOOL,
    OutputType,
    OutputTypeError,
    checked_final,
    tool_parameters,
)
from runtime.sending import sdk_http
from runtime.toolbox.coroutines import run_coroutine, run_once
from runtime.toolbox.guests import GuestAgent, guest_tool_name
from runtime.toolbox.tools import (
    CallContext,
    InvalidArguments,
    Outcome,
    Tool,
    ToolDeclarationError,
    ToolError,
    ToolInDoubt,
    ToolKind,
)
from runtime.toolbox.typed_tools import as_outcome, declared_policy

# The capabilities every 2.68 agent carries (tool search, pending messages): harmless here.
DEFAULT_CAPABILITIES = frozenset({"ToolSearch", "PendingMessageDrainCapability"})
MODEL_TIMEOUT_S = 60.0
# Why a tool timeout is refused: Pydantic AI turns one into ModelRetry, which would tell the
# model to call again a write whose request may have been sent (and leave its body running).
_TIMEOUT = (
    "set the timeout on the tool's own HTTP client: a write cut off by it would be told to "
    "the model as a retry while its request may have left"
)


def parse_kind(agent: str, tool: str, raw: str) -> tuple[ToolKind, float | None]:
    """`read`, `write`, `approval_write` or `keyed_write:<dedupe window in seconds>`."""
    return shared.parse_kind(f"pydantic-ai agent {agent}", tool, raw)


def _refuse(agent: str, feature: str, instead: str) -> ToolDeclarationError:
    return shared.refused(f"pydantic-ai agent {agent}", feature, instead)


def _static_texts(agent: Agent[Any, Any], name: str) -> tuple[str | None, str | None]:
    """Its system prompt and instructions, which must be plain text: a function of them would
    run per request in Pydantic AI, and its result would not be in the sealed record."""
    prompts = list(getattr(agent, "_system_prompts", ()) or ())
    dynamic = getattr(agent, "_system_prompt_functions", ()) or ()
    if dynamic or getattr(agent, "_system_prompt_dynamic_functions", None):
        raise _refuse(name, "a system prompt function", "give the system prompt as text")
    instructions = getattr(agent, "_instructions", None) or []
    if not isinstance(instructions, list | tuple):
        instructions = [instructions]
    # Each is a `SourcedInstruction` in 2.x (its text or function in `.instruction`).
    plain = [getattr(i, "instruction", i) for i in instructions]
    texts = [i for i in plain if isinstance(i, str)]
    if len(texts) != len(instructions):
        raise _refuse(name, "dynamic instructions (a function)", "give the instructions as text")
    system = "\n\n".join(str(p) for p in prompts) or None
    return system, "\n\n".join(texts) or None


def _check_agent(agent: Agent[Any, Any], name: str) -> None:
    """Refuse, naming it, what a run would need and the adapter does not do."""
    if agent.deps_type not in (type(None), None, object):
        raise _refuse(
            name,
            f"deps ({getattr(agent.deps_type, '__name__', agent.deps_type)})",
            "a tool reads what it needs itself (settings, clients); the run's input is text",
        )
    if getattr(agent, "_output_validators", None):
        raise _refuse(name, "an output validator", "put the check in the output type")
    if getattr(agent, "_event_stream_handler", None) is not None:
        raise _refuse(name, "streaming (event_stream_handler)", "read the run's events instead")
    extra = sorted(
        {type(c).__name__ for c in leaf_capabilities(agent.root_capability)} - DEFAULT_CAPABILITIES
    )
    if extra:
        raise _refuse(
            name,
            f"capabilities ({', '.join(extra)}; history processors among them)",
            "drop them: liyagent's loop owns the history (what each step adds is sealed)",
        )
    if callable(agent.model_settings):
        raise _refuse(name, "model settings given as a function", "give them as a dict")
    if getattr(agent, "_dynamic_toolsets", None):
        raise _refuse(name, "a dynamic toolset", "declare its tools on the agent")


def _output(agent: Agent[Any, Any], name: str) -> OutputType | None:
    """The declared output type; None for text output."""
    if agent.output_type is str:
        return None
    try:
        return OutputType.of(agent.output_type)
    except OutputTypeError as exc:
        raise _refuse(name, str(exc), "declare one type") from None


class PydanticAIAgent(GuestAgent):
    """One registered `pydantic_ai.Agent`: its tools, its provider, its output type."""

    framework: ClassVar[str] = "pydantic-ai"

    def __init__(
        self,
        agent: Agent[Any, Any],
        *,
        name: str,
        kinds: Mapping[str, str] | None = None,
        readers: Mapping[str, Callable[..., Any]] | None = None,
        definition_policy: Policy = Policy.PINNED,
    ) -> None:
        super().__init__(name, definition_policy)
        _check_agent(agent, name)
        self.agent = agent
        self._system, self.instructions = _static_texts(agent, name)
        self.output = _output(agent, name)
        self.model = self._model_of(agent)
        self._ctx = RunContext[None](deps=None, model=self.model, usage=RunUsage())
        self.toolsets, self.defs = self._tool_defs()
        self.mcp = self._mcp_tools()
        shared.check_named(
            f"pydantic-ai agent {name}",
            [*self.defs, *self.mcp],
            {"kinds": kinds, "readers": readers},
        )
        # A tool with `requires_approval=True` is an approval write: Pydantic AI's approval
        # becomes liyagent's (held for a person through its approvals).
        self.kinds = {
            t: shared.declared_kind(
                f"pydantic-ai agent {name}",
                t,
                (kinds or {}).get(t),
                held=t in self.defs and self.defs[t].tool_def.kind == "unapproved",
                approval="requires_approval",
            )
            for t in [*self.defs, *self.mcp]
        }
        self.readers = dict(readers or {})
        self._tools = [self._tool(t) for t in self.defs] + [self._mcp_tool(t) for t in self.mcp]
        self._providers = shared.PerThread(lambda: PydanticAIProvider(self, guarded(self.model)))

    def model_name(self) -> str | None:
        """The model the agent's code asks (its model object's name)."""
        return self.model.model_name or None

    def _model_of(self, agent: Agent[Any, Any]) -> Model:
        model = agent.model
        if not isinstance(model, Model):
            raise _refuse(
                self.name,
                f"a model named by a string ({model!r})",
                "give the agent a model object (OpenAIChatModel(..., provider=OpenAIProvider("
                "base_url=..., api_key=...)))",
            )
        from pydantic_ai.models.function import FunctionModel
        from pydantic_ai.models.openai import OpenAIChatModel
        from pydantic_ai.models.test import TestModel

        if not isinstance(model, OpenAIChatModel | FunctionModel | TestModel):
            raise _refuse(
                self.name,
                f"model {type(model).__name__}",
                "use OpenAIChatModel (any OpenAI-compatible endpoint): its HTTP is what "
                "liyagent passes through its send guard",
            )
        return model

    def _tool_defs(self) -> tuple[dict[str, AbstractToolset[Any]], dict[str, Any]]:
        """Each function tool's toolset and its `ToolsetTool` (definition and validator)."""
        owners: dict[str, AbstractToolset[Any]] = {}
        found: dict[str, Any] = {}
        for toolset in self.agent.toolsets:
            if mcp.is_mcp(toolset):
                continue  # `_mcp_tools`
            if not isinstance(toolset, FunctionToolset):
                raise _refuse(
                    self.name,
                    f"toolset {type(toolset).__name__}",
                    "declare its tools as function tools, or give an MCP server's tools as an "
                    "MCPToolset (or with LIYAGENT_MCP_SERVERS)",
                )
            if toolset.timeout is not None:
                raise _refuse(self.name, f"a tool timeout ({toolset.timeout} s)", _TIMEOUT)
            for tool in toolset.tools.values():
                if tool.prepare is not None:
                    raise _refuse(
                        self.name, f"tool {tool.name}'s prepare function", "declare it as is"
                    )
                if tool.timeout is not None:
                    raise _refuse(self.name, f"tool {tool.name}'s timeout", _TIMEOUT)
            # A loop of its own, closed after (a pool may fork after this), on a thread of its
            # own when the module is loaded inside a running loop (an asyncio app's client()).
            listed = run_once(partial(toolset.get_tools, self._ctx))
            for tool_name, listed_tool in listed.items():
                if listed_tool.tool_def.kind not in ("function", "unapproved"):
                    continue  # the output tool is the adapter's own
                owners[tool_name], found[tool_name] = toolset, listed_tool
        return owners, found

    def _mcp_tools(self) -> dict[str, mcp.McpTool]:
        """The agent's MCP toolsets' tools, listed now, by the agent's names for them; a name
        two toolsets (or a function tool) share is refused."""
        found: dict[str, mcp.McpTool] = {}
        for toolset in self.agent.toolsets:
            if not mcp.is_mcp(toolset):
                continue
            for tool_name, one in mcp.mcp_tools_of(self.name, toolset).items():
                if tool_name in found or tool_name in self.defs:
                    raise ToolDeclarationError(
                        f"pydantic-ai agent {self.name}: two of its tools are named "
                        f"{tool_name!r} (one of its MCP toolsets' among them); give one "
                        "another name"
                    )
                found[tool_name] = one
        return found

    def _mcp_tool(self, tool_name: str) -> Tool:
        """An MCP tool as liyagent's MCP client calls it, of the kind the team declared."""
        kind, window = self.kinds[tool_name]
        tool = self.mcp[tool_name].tool
        return replace(
            tool,
            kind=kind,
            dedupe_window_s=window,
            reader=shared.write_reader(
                f"pydantic-ai agent {self.name}", tool_name, kind, self.readers, tool.name
            ),
            origin=f"pydantic-ai agent {self.name} ({tool.origin})",
        )

    def _tool(self, tool_name: str) -> Tool:
        kind, window = self.kinds[tool_name]
        definition: ToolDefinition = self.defs[tool_name].tool_def
        registry_name = guest_tool_name(self.name, tool_name)

        def validate(args: dict[str, Any]) -> dict[str, Any]:
            try:
                checked = self.defs[tool_name].args_validator.validate_python(args)
            except pydantic.ValidationError as exc:
                found = [{"field": f, "message": m} for f, m in problems(exc, "(arguments)")]
                raise InvalidArguments(registry_name, found) from None
            return dict(checked)

        def invoke(args: dict[str, Any], ctx: CallContext) -> Outcome:
            checked = validate(args)
            tool_ctx = self._tool_ctx(ctx, tool_name)
            try:
                self._check_args(tool_name, checked, tool_ctx)
                # The lease, just before, whatever kind the registry gives the tool now (a
                # LIYAGENT_TOOL_KINDS override may make a read a write): the body may send with
                # a client the guard does not see, and from here a failure is in doubt (a
                # read's is only said: making it again is harmless).
                ctx.check_send()
                with shared.in_call(ctx):
                    result = run_coroutine(
                        self.toolsets[tool_name].call_tool(
                            tool_name, checked, tool_ctx, self.defs[tool_name]
                        )
                    )
            except exceptions.ModelRetry as exc:
                raise ToolError(str(exc)) from exc
            except (ToolError, ToolInDoubt):
                raise
            return as_outcome(result)

        return Tool(
            name=registry_name,
            kind=kind,
            reader=shared.write_reader(
                f"pydantic-ai agent {self.name}", tool_name, kind, self.readers, registry_name
            ),
            description=definition.description or tool_name,
            invoke=invoke,
            dedupe_window_s=window,
            parameters=definition.parameters_json_schema,
            validate=validate,
            origin=f"pydantic-ai agent {self.name}",
        )

    def _check_args(self, tool_name: str, args: dict[str, Any], ctx: RunContext[None]) -> None:
        """The tool's own `args_validator`, as Pydantic AI runs it after the schema's: before
        anything is sent, so its `ModelRetry` is a call that failed for certain, told to the
        model."""
        check = self.defs[tool_name].args_validator_func
        if check is not None:
            result = check(ctx, **args)
            if inspect.isawaitable(result):
                run_coroutine(cast(Any, result))

    def _tool_ctx(self, ctx: CallContext, tool_name: str) -> RunContext[None]:
        return RunContext[None](
            deps=None,
            model=self.model,
            usage=RunUsage(),
            tool_call_id=ctx.call_id,
            tool_name=tool_name,
            run_step=ctx.step,
            run_id=ctx.run_id,
        )

    def tools(self, origin: str) -> list[Tool]:
        return list(self._tools)

    def system(self) -> str | None:
        return self._system

    def provider(self) -> ModelProvider:
        """One per process and thread (each thread runs its own event loop)."""
        return self._providers.get()

    def output_type(self) -> OutputType | None:
        return self.output

    def function_defs(self) -> list[ToolDefinition]:
        return [t.tool_def for t in self.defs.values()] + [t.definition for t in self.mcp.values()]


def guarded(model: Model) -> Model:
    """The agent's model with its OpenAI client's HTTP through the send guard, its own retries
    off (the engine decides when to ask again): the same model name, endpoint, key, profile
    and settings. A model that makes no HTTP (FunctionModel, TestModel) is used as it is."""
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider

    if not isinstance(model, OpenAIChatModel):
        return model
    client = shared.plain_chat_body(
        model.client.copy(http_client=sdk_http.async_client(MODEL_TIMEOUT_S), max_retries=0)
    )
    return OpenAIChatModel(
        model.model_name,
        provider=OpenAIProvider(openai_client=client),
        profile=model.profile,
        settings=cast(Any, without_retries(model.settings)),
    )


def without_retries(settings: Mapping[str, Any] | None) -> dict[str, Any]:
    """Model settings with their `max_retries` left out: the engine decides when a step is
    asked again (one classifier, the step limit), so the SDK client's retries stay off (a
    `max_retries` would have Pydantic AI copy the client with that many)."""
    return {k: v for k, v in (settings or {}).items() if k != "max_retries"}


class PydanticAIProvider:
    """Answers each step with one request to the agent's own model."""

    name = "pydantic-ai"

    def __init__(self, guest: PydanticAIAgent, model: Model) -> None:
        self.guest = guest
        self.model = model
        self.prefix = f"{guest.name}."
        self.params = ModelRequestParameters(
            function_tools=guest.function_defs(),
            output_mode="tool" if guest.output is not None else "text",
            output_tools=[self._output_def()] if guest.output is not None else [],
            allow_text_output=guest.output is None,
        )
        # Sent besides the messages and instructions: the ledger's reservation counts it.
        self.prompt_fixed: list[Any] = [guest.system(), self.params]
        self.model_name = model.model_name

    def _output_def(self) -> ToolDefinition:
        assert self.guest.output is not None
        return ToolDefinition(
            name=OUTPUT_TOOL,
            parameters_json_schema=tool_parameters(self.guest.output.schema),
            description=OUTPUT_DESCRIPTION,
            kind="output",
        )

    def next_step(self, request: StepRequest) -> StepAnswer:
        settings = without_retries(cast(Mapping[str, Any], self.guest.agent.model_settings))
        settings["extra_headers"] = {**settings.get("extra_headers", {}), **request.headers()}
        instructions = self.guest.instructions_for(request)  # those its run pinned
        try:
            response = run_coroutine(
                direct.model_request(
                    self.model,
                    to_model_messages(request.messages, self.prefix, instructions),
                    model_settings=settings,  # type: ignore[arg-type]
                    model_request_parameters=self.params,
                    instrument=False,
                )
            )
        except exceptions.ModelHTTPError as exc:
            raise shared.model_error(request.run_id, exc) from exc
        except exceptions.ModelRequestTimeout as exc:
            # The agent's own `request_timeout` ran out: a timeout like the client's, though no
            # transport error is under it.
            raise shared.model_error(request.run_id, TimeoutError(str(exc))) from exc
        except (exceptions.ModelAPIError, exceptions.UnexpectedModelBehavior) as exc:
            refused = shared.send_refused(exc)
            if refused is not None:
                raise refused from None  # the attempt stops; asking again cannot help
            # No response (timeout, lost connection: asked again) or an answer Pydantic AI
            # could not use (not asked again): see shared.model_error.
            raise shared.model_error(request.run_id, exc) from exc
        # Its usage reaches the step's write with the answer (store/usage.py).
        return replace(self.answer(response), usage=usage_of(response))

    def answer(self, response: messages.ModelResponse) -> StepAnswer:
        """The step's answer from the model's response: calls, a final text, a typed final
        answer, or a final answer refused for its type (the model is then told why)."""
        text = "".join(p.content for p in response.parts if isinstance(p, messages.TextPart))
        calls = [self._call(p) for p in response.parts if isinstance(p, messages.ToolCallPart)]
        if self.guest.output is None:
            return StepAnswer(text=text or None, calls=calls)
        return checked_final(text or None, calls, self.guest.output.plain)

    def _call(self, part: messages.ToolCallPart) -> ToolCall:
        name = part.tool_name if part.tool_name == OUTPUT_TOOL else self.prefix + part.tool_name
        # Arguments the model wrote that are not a JSON object: the call is not made, the model
        # is told (as for arguments that fail their schema), the raw text given back as it was.
        raw = part.args if isinstance(part.args, str) else None
        args, error = read_arguments(raw) if raw is not None and raw.strip() else (None, None)
        if error is not None:
            return ToolCall(part.tool_call_id, name, {}, args_error=error, raw_args=raw)
        return ToolCall(part.tool_call_id, name, args if args is not None else part.args_as_dict())


def durable(
    agent: Agent[Any, Any],
    *,
    name: str | None = None,
    kinds: Mapping[str, str] | None = None,
    readers: Mapping[str, Callable[..., Any]] | None = None,
    definition_policy: str = "pinned",
) -> PydanticAIAgent:
    """Register a `pydantic_ai.Agent` to run on liyagent (hold the result at the top level of
    a module LIYAGENT_TOOLS names); `kinds` maps each tool to `read`, `write`,
    `approval_write` or `keyed_write:<seconds>` (a tool not named is a write); `readers` maps
    a write to the function that finds its outcome by the call's key after a crash (the
    `CallContext` first, then the write's arguments; None when it finds none);
    `definition_policy`: "pinned" or "follow_latest" (runtime/durable/policy.py)."""
    chosen = name or agent.name
    if not chosen:
        raise ToolDeclarationError("durable(agent): give the agent a name (name=...)")
    policy = declared_policy(chosen, definition_policy)
    return PydanticAIAgent(
        agent, name=chosen, kinds=kinds, readers=readers, definition_policy=policy
    )


# Shared with the other adapters (runtime/frameworks/calls.py), named here as before.
_decoded = decoded
__all__ = [
    "OUTPUT_TOOL",
    "CallTransport",
    "PydanticAIAgent",
    "current_call",
    "durable",
    "parse_kind",
]
