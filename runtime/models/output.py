"""An agent's output type: its final answer is a value of a declared type, checked before the
run ends, and read back by the app as that type.

A native agent declares one with `agent(..., output=DeskAnswer)` (a pydantic model, dataclass,
TypedDict, scalar or union); a framework agent has its framework's (`output_type=`). The model
is offered an output tool, `final_result` (as Pydantic AI offers it), whose arguments are the
answer: a schema that is not an object is wrapped as `{"response": ...}`. A call of it that fits
ends the run with the value sealed with the answer (`Typed`); one that does not fit, a final
answer given as text, or the output tool called beside other tools, is refused: the step is
written with the model told why (`RunState.take_refused`) and the next one is asked, within the
step limit.

A native run carries its type's JSON schema in its sealed definition (`RunDefinition.output`),
so every worker checks the answer against the type the run started with. A worker whose tool
modules declare the agent with that very schema checks with the type itself (its own
validators run, defaults are filled); any other checks against the schema (`jsonschema`).
"""

from __future__ import annotations

import json
import types
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import pydantic
from pydantic_core import to_jsonable_python

from runtime.base.validation import described
from runtime.durable.state import ToolCall
from runtime.models.base import ModelProvider, StepAnswer, StepRequest, Typed
from store.errors import LiyagentError

OUTPUT_TOOL = "final_result"
OUTPUT_DESCRIPTION = "The final response which ends this conversation"
# What a type that is not one (a list of types, an output function, a framework's marker) is.
ONE_TYPE = "declare one type (a pydantic model, dataclass, TypedDict, scalar or union)"


class OutputTypeError(LiyagentError, ValueError):
    """The declared output type cannot be checked; the message says why."""


def wrapped(schema: Mapping[str, Any]) -> bool:
    """Whether the output tool's arguments wrap the value in `response` (its schema is not
    an object's: tool arguments always are one)."""
    return schema.get("type") != "object"


def tool_parameters(schema: Mapping[str, Any]) -> dict[str, Any]:
    """The output tool's parameters for a type of JSON schema `schema`."""
    if not wrapped(schema):
        return dict(schema)
    return {"type": "object", "properties": {"response": dict(schema)}, "required": ["response"]}


def output_tool(schema: Mapping[str, Any]) -> dict[str, Any]:
    """The output tool as a model is offered it (the shape of `Tool.schema`)."""
    return {
        "name": OUTPUT_TOOL,
        "description": OUTPUT_DESCRIPTION,
        "parameters": tool_parameters(schema),
    }


def unwrapped(schema: Mapping[str, Any], args: Any) -> Any:
    """The answer's value from the output tool's arguments; ValueError when it is not there."""
    if not wrapped(schema):
        return args
    if not isinstance(args, dict) or "response" not in args:
        raise ValueError("the answer is an object with its value in response")
    return args["response"]


@dataclass(frozen=True)
class OutputType:
    """A declared output type: its validator and its JSON schema."""

    declared: Any
    adapter: pydantic.TypeAdapter[Any] = field(repr=False, compare=False)
    schema: dict[str, Any] = field(compare=False)

    @classmethod
    def of(cls, declared: Any) -> OutputType:
        """The type `declared`, or OutputTypeError saying why it cannot be one."""
        one = isinstance(declared, type | types.UnionType)
        if not one and getattr(declared, "__origin__", None) is None:
            raise OutputTypeError(
                f"output type {declared!r} is not a type (an output function, ToolOutput, "
                f"NativeOutput, a list of types, ...); {ONE_TYPE}"
            )
        try:
            adapter: pydantic.TypeAdapter[Any] = pydantic.TypeAdapter(declared)
            schema = adapter.json_schema()
        except Exception as exc:
            raise OutputTypeError(f"output type {declared!r} ({exc}); {ONE_TYPE}") from None
        return cls(declared, adapter, schema)

    @property
    def name(self) -> str:
        return str(getattr(self.declared, "__name__", self.declared))

    def plain(self, args: Any) -> Any:
        """The value the output tool's arguments `args` give, validated by the type, as JSON
        (what is sealed); ValueError saying what does not fit."""
        try:
            value = self.adapter.validate_python(unwrapped(self.schema, args))
        except pydantic.ValidationError as exc:
            raise ValueError(described(exc, "(answer)")) from None
        return to_jsonable_python(value)

    def load(self, plain: Any) -> Any:
        """The typed value of a stored answer (its JSON); pydantic.ValidationError when it
        does not fit this type."""
        return self.adapter.validate_json(json.dumps(plain))


def checked_schema(schema: Any) -> dict[str, Any]:
    """`schema` if it is a JSON Schema an answer can be checked against; ValueError saying
    what is wrong otherwise."""
    if not isinstance(schema, dict):
        raise ValueError("output is a JSON Schema (an object)")
    import jsonschema  # only where a schema is checked: a tool module's import stays light
    from jsonschema.validators import validator_for

    try:
        validator_for(schema).check_schema(schema)
    except jsonschema.SchemaError as exc:
        raise ValueError(f"output is not a valid JSON Schema ({exc.message})") from None
    return schema


def schema_fit(schema: Mapping[str, Any]) -> Callable[[Any], Any]:
    """The check of the output tool's arguments against the type's JSON schema alone: the
    value as the model gave it, or ValueError naming each field that does not fit."""
    from jsonschema.validators import validator_for

    parameters = tool_parameters(schema)
    checker = validator_for(parameters)(parameters)

    def fit(args: Any) -> Any:
        errors = sorted(checker.iter_errors(args), key=lambda e: list(e.absolute_path))
        if errors:
            raise ValueError(
                "; ".join(
                    f"{'.'.join(str(p) for p in e.absolute_path) or '(answer)'}: {e.message}"
                    for e in errors
                )
            )
        return unwrapped(schema, args)

    return fit


def checked_final(text: str | None, calls: list[ToolCall], fit: Callable[[Any], Any]) -> StepAnswer:
    """A step's answer when the agent declares an output type: the calls it asks for; its
    final answer, the output tool's call alone, whose arguments `fit` turns into the value
    (ValueError: they do not fit); or a refusal the model is told (see the module)."""
    outputs = [c for c in calls if c.name == OUTPUT_TOOL]
    if not outputs:
        if calls:
            return StepAnswer(text=text, calls=calls)
        refused = f"a final answer is given by calling {OUTPUT_TOOL}, not as text"
        return StepAnswer(text=text, calls=[], refused=refused)
    if len(calls) > 1:
        refused = f"{OUTPUT_TOOL} is called alone, after the other tools' results"
        return StepAnswer(text=text, calls=calls, refused=refused)
    [call] = outputs
    try:
        if call.args_error is not None:
            raise ValueError(call.args_error)
        plain = fit(call.args)
    except ValueError as exc:
        refused = f"the answer does not fit its type: {exc}"
        return StepAnswer(text=text, calls=calls, refused=refused)
    return StepAnswer(text=json.dumps(plain, sort_keys=True), calls=[], output=Typed(plain))


class TypedAnswers:
    """A native agent's provider, its answers checked against the run's output type: the
    model is offered the output tool, and each answer is `checked_final`."""

    def __init__(
        self, inner: ModelProvider, schema: dict[str, Any], declared: OutputType | None
    ) -> None:
        self.inner = inner
        self.name = inner.name
        self.tool = output_tool(schema)
        # What each request sends beyond its messages and tools (runtime/core/ledger.py).
        self.prompt_fixed: list[Any] = [self.tool, *getattr(inner, "prompt_fixed", ())]
        # The type itself when the worker's declaration is the one the run started with.
        self.fit: Callable[[Any], Any] = schema_fit(schema)
        if declared is not None and declared.schema == schema:
            self.fit = declared.plain

    def next_step(self, request: StepRequest) -> StepAnswer:
        answer = self.inner.next_step(replace(request, tools=[*request.tools, self.tool]))
        return replace(checked_final(answer.text, answer.calls, self.fit), usage=answer.usage)


__all__ = [
    "OUTPUT_TOOL",
    "OutputType",
    "OutputTypeError",
    "TypedAnswers",
    "checked_final",
    "checked_schema",
    "output_tool",
    "tool_parameters",
]
