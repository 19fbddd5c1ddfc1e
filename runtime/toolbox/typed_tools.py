"""Users' tools as typed Python functions, sync or async.

    @tool.write
    def post_comment(ctx: CallContext, issue: str, body: str) -> Comment:
        '''Comment on an issue.'''
        return Comment.model_validate(ctx.http.post(f"{BASE}/issues/{issue}/comments",
                                                    json={"body": body}).raise_for_status().json())

    @post_comment.read_back
    def find_comment(ctx: CallContext, issue: str, body: str) -> Comment | None: ...

The decorator declares the kind the engine settles a call by; the parameters' JSON schema and
the validation of the model's arguments come from the type hints through pydantic, the
description from the docstring, each parameter's description from its `Args:` (Google),
`Parameters` (NumPy) or `:param x:` (Sphinx) entry (`docstring_parser`). A first parameter
annotated `CallContext` receives the call's context. Whatever the function raises after its
request may have left is in doubt, settled by its kind; what it raises while no request of the
call has left (the send guard knows) failed for certain; `ToolError` is a definite refusal the
model is told.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, TypeVar, get_type_hints, overload

import docstring_parser
import pydantic
import structlog
from pydantic_core import to_jsonable_python

from runtime.base.validation import problems
from runtime.durable.policy import Policy
from runtime.models.base import ModelError
from runtime.models.output import OUTPUT_TOOL, OutputType, OutputTypeError
from runtime.models.specs import check_shape
from runtime.sending.http import SendRefused
from runtime.toolbox.coroutines import run_coroutine
from runtime.toolbox.tools import (
    AgentDef,
    CallContext,
    InvalidArguments,
    Outcome,
    Tool,
    ToolDeclarationError,
    ToolError,
    ToolInDoubt,
    ToolKind,
    classify,
    declared_at,
)

log = structlog.get_logger(__name__)

Fn = Callable[..., Any]
R = TypeVar("R", bound=Callable[..., Any])
# Kinds a user's function may declare; delegation and remote agents are the engine's own.
USER_KINDS = (ToolKind.READ, ToolKind.WRITE, ToolKind.KEYED_WRITE, ToolKind.APPROVAL_WRITE)


class FunctionTool:
    """A declared function tool; stays callable as the plain function (for users' own tests).
    The registry turns it into a `Tool` when its module is loaded."""

    def __init__(
        self,
        fn: Fn,
        *,
        kind: ToolKind,
        name: str | None,
        description: str | None,
        dedupe_window_s: float | None,
    ) -> None:
        self.fn = fn
        self.kind = kind
        self.name = name or fn.__name__
        doc = _doc(fn)
        # Undocumented: the model sees only its name; said when the tool is loaded.
        self.documented = bool(description or doc.description)
        self.description = description or doc.description or self.name
        self.dedupe_window_s = dedupe_window_s
        self.reader_fn: Fn | None = None
        self.takes_ctx, self.args_model = _signature(fn, self.name, doc.params)
        self.__doc__ = fn.__doc__
        self.__wrapped__ = fn

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.fn(*args, **kwargs)

    def read_back(self, reader: R) -> R:
        """Declare the reader of this write: called with the write's arguments and a context
        whose `key` is the write's key; returns its outcome, or None when it finds none."""
        if self.kind not in (ToolKind.WRITE, ToolKind.APPROVAL_WRITE):
            raise ToolDeclarationError(f"tool {self.name}: only a write has a reader")
        self.reader_fn = reader
        return reader

    def to_tool(self, origin: str) -> Tool:
        """The tool the registry holds; an undocumented one is logged (a warning naming it)."""
        if not self.documented:
            log.warning(
                "tool.undocumented",
                tool=self.name,
                origin=origin,
                next="add a docstring saying what the tool does: the model sees only its name",
            )
        reader = None
        if self.reader_fn is not None:
            reader = reader_for(self.reader_fn, self.name)
        return Tool(
            name=self.name,
            kind=self.kind,
            description=self.description,
            invoke=self._invoke,
            reader=reader,
            dedupe_window_s=self.dedupe_window_s,
            parameters=self.args_model.model_json_schema(),
            validate=self._validate,
            origin=origin,
            declared_at=declared_at(self.fn),
        )

    def _validate(self, args: dict[str, Any]) -> dict[str, Any]:
        return validate_args(self.args_model, self.name, args)

    def _invoke(self, args: dict[str, Any], ctx: CallContext) -> Outcome:
        return as_outcome(call_user(self.fn, self.takes_ctx, self._validate(args), ctx))


def validate_args(model: type[pydantic.BaseModel], tool: str, args: Any) -> dict[str, Any]:
    """The arguments as the function takes them, or InvalidArguments saying what is wrong."""
    try:
        parsed = model.model_validate(args)
    except pydantic.ValidationError as exc:
        found = [
            {"field": field, "message": message} for field, message in problems(exc, "(arguments)")
        ]
        raise InvalidArguments(tool, found) from None
    return {name: getattr(parsed, name) for name in type(parsed).model_fields}


def call_user(fn: Fn, takes_ctx: bool, kwargs: dict[str, Any], ctx: CallContext) -> Any:
    """Run a user's function (awaiting it if async) and classify what it raises: a definite
    refusal stays `ToolError`, the send guard's refusal stops the attempt, anything else is
    `ToolFailed` while no request of the call has left and `ToolInDoubt` once one may have."""
    try:
        result = fn(ctx, **kwargs) if takes_ctx else fn(**kwargs)
        if inspect.isawaitable(result):
            result = run_coroutine(result)
        return result
    except (ToolError, ToolInDoubt, SendRefused):
        raise
    except Exception as exc:
        raise classify(exc) from exc


def as_outcome(value: Any) -> Outcome:
    """A tool's result as a JSON object (pydantic models dumped, other values wrapped)."""
    plain = to_jsonable_python(value, fallback=str)
    if plain is None:
        return {}
    return plain if isinstance(plain, dict) else {"result": plain}


def reader_for(fn: Fn, tool: str) -> Callable[[dict[str, Any], CallContext], Outcome | None]:
    """A write's reader from a typed function (the context first, then the write's arguments)."""
    takes_ctx, model = _signature(fn, f"{tool} (reader)")

    def read(args: dict[str, Any], ctx: CallContext) -> Outcome | None:
        found = call_user(fn, takes_ctx, validate_args(model, tool, args), ctx)
        return None if found is None else as_outcome(found)

    return read


def _signature(
    fn: Fn, name: str, described: dict[str, str] | None = None
) -> tuple[bool, type[pydantic.BaseModel]]:
    """Whether the function takes the context first, and a model of its other parameters
    (each with its docstring's description, unless its type hint carries one)."""
    try:
        hints = get_type_hints(fn, include_extras=True)
    except Exception as exc:
        raise ToolDeclarationError(f"tool {name}: its type hints cannot be read ({exc})") from exc
    params = list(inspect.signature(fn).parameters.values())
    takes_ctx = bool(params) and hints.get(params[0].name) is CallContext
    fields: dict[str, Any] = {}
    for param in params[1:] if takes_ctx else params:
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD, param.POSITIONAL_ONLY):
            raise ToolDeclarationError(
                f"tool {name}: parameter {param.name} must be a plain named parameter"
            )
        if param.name not in hints:
            raise ToolDeclarationError(
                f"tool {name}: parameter {param.name} needs a type hint (it is the schema)"
            )
        default = ... if param.default is param.empty else param.default
        text = (described or {}).get(param.name)
        hinted = pydantic.fields.FieldInfo.from_annotation(hints[param.name]).description
        if text and not hinted:
            default = pydantic.Field(default, description=text)
        fields[param.name] = (hints[param.name], default)
    model = pydantic.create_model(
        f"{name.replace('.', '_')}_arguments",
        __config__=pydantic.ConfigDict(extra="forbid"),
        **fields,
    )
    return takes_ctx, model


@dataclass(frozen=True)
class Doc:
    """What a function's docstring says: its description, and each parameter's."""

    description: str
    params: dict[str, str]


def _doc(fn: Fn) -> Doc:
    """The docstring read by `docstring_parser` (Google, NumPy, Sphinx or plain): its first
    paragraph is the description (the rest is for readers), its parameter entries the
    parameters'."""
    parsed = docstring_parser.parse(inspect.getdoc(fn) or "")
    params = {
        p.arg_name: " ".join(p.description.split())
        for p in parsed.params
        if p.description and p.description.strip()
    }
    first = (parsed.description or "").strip().split("\n\n")[0]
    return Doc(" ".join(first.split()), params)


Declare = Callable[[Fn], "FunctionTool"]


class _Declare:
    """`@tool.read`, `@tool.write`, `@tool.keyed_write(dedupe_window_s=...)`,
    `@tool.approval_write`, or `@tool(kind=..., name=..., description=...)`."""

    @overload
    def __call__(self, fn: Fn, /) -> FunctionTool: ...

    @overload
    def __call__(
        self,
        fn: None = None,
        /,
        *,
        kind: str | ToolKind = ...,
        name: str | None = ...,
        description: str | None = ...,
        dedupe_window_s: float | None = ...,
    ) -> Declare: ...

    def __call__(
        self,
        fn: Fn | None = None,
        /,
        *,
        kind: str | ToolKind = ToolKind.READ,
        name: str | None = None,
        description: str | None = None,
        dedupe_window_s: float | None = None,
    ) -> FunctionTool | Declare:
        def declare(f: Fn) -> FunctionTool:
            return FunctionTool(
                f,
                kind=_user_kind(kind, name or str(getattr(f, "__name__", "?"))),
                name=name,
                description=description,
                dedupe_window_s=dedupe_window_s,
            )

        return declare if fn is None else declare(fn)

    @overload
    def read(self, fn: Fn, /) -> FunctionTool: ...
    @overload
    def read(self, fn: None = None, /, **options: Any) -> Declare: ...
    def read(self, fn: Fn | None = None, /, **options: Any) -> FunctionTool | Declare:
        """A read: harmless to make again, never marked; made again on resume."""
        return self._kind(fn, ToolKind.READ, options)

    @overload
    def write(self, fn: Fn, /) -> FunctionTool: ...
    @overload
    def write(self, fn: None = None, /, **options: Any) -> Declare: ...
    def write(self, fn: Fn | None = None, /, **options: Any) -> FunctionTool | Declare:
        """A write: marked in doubt before it is sent; after a crash it is read back by its
        reader (`@my_write.read_back`) or reported unknown, never sent again."""
        return self._kind(fn, ToolKind.WRITE, options)

    @overload
    def keyed_write(self, fn: Fn, /) -> FunctionTool: ...
    @overload
    def keyed_write(self, fn: None = None, /, **options: Any) -> Declare: ...
    def keyed_write(self, fn: Fn | None = None, /, **options: Any) -> FunctionTool | Declare:
        """A write whose vendor dedupes on the idempotency key for `dedupe_window_s`: sent
        again with the same key when that window outlasts a resume."""
        return self._kind(fn, ToolKind.KEYED_WRITE, options)

    @overload
    def approval_write(self, fn: Fn, /) -> FunctionTool: ...
    @overload
    def approval_write(self, fn: None = None, /, **options: Any) -> Declare: ...
    def approval_write(self, fn: Fn | None = None, /, **options: Any) -> FunctionTool | Declare:
        """A write held until a person approves it; sent with the approval id as its key."""
        return self._kind(fn, ToolKind.APPROVAL_WRITE, options)

    def _kind(
        self, fn: Fn | None, kind: ToolKind, options: dict[str, Any]
    ) -> FunctionTool | Declare:
        if "kind" in options:
            raise ToolDeclarationError(f"@tool.{kind.value} takes no kind; it is {kind.value}")
        declare = self(None, kind=kind, **options)
        return declare if fn is None else declare(fn)


def _user_kind(kind: str | ToolKind, name: str) -> ToolKind:
    try:
        tool_kind = ToolKind(kind)
    except ValueError:
        raise ToolDeclarationError(
            f"tool {name}: unknown kind {kind!r}; use one of "
            f"{', '.join(k.value for k in USER_KINDS)}"
        ) from None
    if tool_kind not in USER_KINDS:
        raise ToolDeclarationError(
            f"tool {name}: kind {tool_kind.value} is the engine's own; declare read, write, "
            "keyed_write or approval_write"
        )
    return tool_kind


tool = _Declare()


def agent(
    name: str,
    *,
    model: dict[str, Any],
    tools: Iterable[str | FunctionTool | Tool] | None = None,
    system: str | None = None,
    description: str | None = None,
    output: Any = None,
    definition_policy: str = "pinned",
) -> AgentDef:
    """Declare an agent next to its tools: its model spec, its tools (objects or names), its
    system prompt, its public description (the A2A card's) and its output type (`output=`: a
    pydantic model, dataclass, TypedDict, scalar or union; its final answer is then a value of
    it, checked before the run ends, read back as `RunView.output`), and what its runs do when
    a worker's code no longer serves the definition they started with (`definition_policy`:
    "pinned", wait for a worker that does; "follow_latest", take the new one). Loaded with
    the module, like the tools."""
    names = None if tools is None else [t if isinstance(t, str) else t.name for t in tools]
    if not name.strip():
        raise ToolDeclarationError("an agent needs a name")
    try:
        check_shape(model)  # a typo or an inline key fails the module's load, not its runs
    except ModelError as exc:
        raise ToolDeclarationError(f"agent {name}: {exc}") from None
    return AgentDef(
        name=name,
        model=dict(model),
        tools=names,
        system=system,
        origin="python",
        description=description,
        output=_output_type(name, output, names),
        definition_policy=declared_policy(name, definition_policy),
    )


def declared_policy(agent: str, raw: str) -> Policy:
    """An agent's definition policy, or the declaration refused naming the ones there are."""
    try:
        return Policy(raw)
    except ValueError:
        known = ", ".join(p.value for p in Policy)
        raise ToolDeclarationError(
            f"agent {agent}: definition_policy must be one of {known} (got {raw!r})"
        ) from None


def _output_type(agent: str, output: Any, tools: list[str] | None) -> OutputType | None:
    """An agent's declared output type (None for text: none, or `str`)."""
    if output is None or output is str:
        return None
    try:
        found = OutputType.of(output)
    except OutputTypeError as exc:
        raise ToolDeclarationError(f"agent {agent}: {exc}") from None
    if OUTPUT_TOOL in (tools or ()):
        raise ToolDeclarationError(
            f"agent {agent}: a tool named {OUTPUT_TOOL} cannot be offered with an output type "
            f"(its final answer is given by calling {OUTPUT_TOOL}); rename the tool"
        )
    return found
