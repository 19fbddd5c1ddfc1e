"""Tools served by MCP servers (streamable HTTP, the official `mcp` SDK), made durable.

`LIYAGENT_MCP_SERVERS` lists the servers (`mcp_config.py`: URL, auth header from an environment
variable, name prefix, per-tool overrides). Every process lists each server's tools at start; a
server that cannot be reached stops the process with a message naming it, as a tool module that
does not import does. Each MCP tool becomes a `Tool`: a read when its annotations say
`readOnlyHint: true`, otherwise a write (`idempotentHint` alone is not a key: only the operator,
who knows the server dedupes on the key, may declare a keyed write), with the operator's
override per tool. Its input schema goes to the model as is, and the model's arguments are
validated against it (jsonschema) before anything is marked or sent.

A call sends the step key as the `Idempotency-Key` header on every HTTP request of the call and
in the call's `_meta` (`liyagent/idempotency_key`), through the guarded pooled client of
`http.py` (`sdk_http.py`). Its outcome is classified like any other vendor call: a result is the
outcome, an `isError` result or a refusal the server answered (4xx, a JSON-RPC error saying the
call was not taken) is a definite `ToolError` the model is told, and anything else once the call
may have left (a timeout, a lost connection, a 5xx) is `ToolInDoubt`, settled by its kind; a
failure before its `tools/call` left (the server unreachable, its session refused) is
`ToolFailed`: nothing was sent.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any, cast

import httpx2
import jsonschema
from jsonschema.validators import validator_for
from mcp import Client, types
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError
from mcp_types import HEADER_MISMATCH, INVALID_PARAMS, INVALID_REQUEST, METHOD_NOT_FOUND

from runtime.models.base import ModelError
from runtime.models.openai import checked_wire_name
from runtime.sending import http, sdk_http
from runtime.sending.http import SendRefused
from runtime.toolbox.coroutines import run_coroutine, run_once
from runtime.toolbox.mcp_config import SETTING, ServerConfig, ToolOverride, load_config
from runtime.toolbox.tools import (
    CallContext,
    InvalidArguments,
    Outcome,
    Tool,
    ToolDeclarationError,
    ToolError,
    ToolFailed,
    ToolInDoubt,
    ToolKind,
)
from runtime.toolbox.typed_tools import USER_KINDS

META_KEY = "liyagent/idempotency_key"
# JSON-RPC errors by which a server says it did not take the call (unknown tool, bad
# arguments, a stale listing): definite refusals, never in doubt.
REFUSED_CODES = frozenset({INVALID_PARAMS, METHOD_NOT_FOUND, INVALID_REQUEST, HEADER_MISMATCH})
# A server that pages its listing forever cannot hang a process's start.
MAX_PAGES = 50
CLIENT_INFO = types.Implementation(name="liyagent", version="1")


def sources(raw: str) -> list[Callable[[], list[Tool]]]:
    """One tool source per configured server, for `load_registry(extra=...)`."""
    return [partial(server_tools, server) for server in load_config(raw)]


def server_tools(server: ServerConfig) -> list[Tool]:
    """The server's tools as the engine's, listed now (at process start); a server that cannot
    be reached, or a tool that cannot be offered, stops the process with the reason."""
    listed = list_tools(server)
    served = {t.name for t in listed}
    unknown = sorted(set(server.tools) - served)
    if unknown:
        raise ToolDeclarationError(
            f"{SETTING}: server {server.name} overrides tools it does not serve: {unknown}; "
            f"it serves {sorted(served)}"
        )
    return [to_tool(server, t) for t in listed]


def list_tools(server: ServerConfig) -> list[types.Tool]:
    """The server's tools, or ToolDeclarationError saying why they cannot be listed."""
    try:
        return run_once(partial(_list, server))
    except ToolDeclarationError:
        raise
    except BaseException as exc:  # any failure to list stops the process
        if isinstance(exc, KeyboardInterrupt | SystemExit):
            raise
        raise ToolDeclarationError(
            f"{SETTING}: MCP server {server.name} at {server.url} cannot list its tools "
            f"({_why(exc)}); start it, fix its url or auth, or remove it from {SETTING}"
        ) from None


async def _list(server: ServerConfig) -> list[types.Tool]:
    pool = http.new_async_client(server.timeout_s)
    try:
        client = sdk_http.async_client(server.timeout_s, server.headers(), lambda: pool)
        tools: list[types.Tool] = []
        async with client, _connect(server, client, server.timeout_s) as session:
            cursor: str | None = None
            for _ in range(MAX_PAGES):
                page = await session.list_tools(cursor=cursor, cache_mode="refresh")
                tools += page.tools
                cursor = page.next_cursor
                if cursor is None:
                    break
        return tools
    finally:
        await pool.aclose()


def _connect(server: ServerConfig, client: httpx2.AsyncClient, timeout_s: float) -> Client:
    transport = streamable_http_client(server.url, http_client=client)
    return Client(transport, read_timeout_seconds=timeout_s, client_info=CLIENT_INFO, cache=None)


def to_tool(server: ServerConfig, listed: types.Tool) -> Tool:
    """One MCP tool as the engine's `Tool`: its kind from its annotations and the override."""
    override = server.override(listed.name)
    name = server.our_name(listed.name)
    origin = f"MCP server {server.name} ({server.url})"
    try:
        checked_wire_name(name)
    except ModelError as exc:
        raise ToolDeclarationError(
            f"{SETTING}: server {server.name} tool {listed.name!r}: {exc}; give it another "
            'name with "tools": {"' + listed.name + '": {"name": "..."}}'
        ) from None
    schema = dict(listed.input_schema or {"type": "object"})
    try:
        checker = validator_for(schema)
        checker.check_schema(schema)
    except jsonschema.SchemaError as exc:
        raise ToolDeclarationError(
            f"{SETTING}: server {server.name} tool {listed.name!r} has an input schema that is "
            f"not valid JSON Schema ({exc.message})"
        ) from None
    call = McpCall(server, listed.name, name, checker(schema))
    return Tool(
        name=name,
        kind=_kind(listed, override),
        description=listed.description or listed.title or listed.name,
        invoke=call.invoke,
        dedupe_window_s=override.dedupe_window_s,
        parameters=schema,
        validate=call.validate,
        origin=origin,
    )


def _kind(listed: types.Tool, override: ToolOverride) -> ToolKind:
    """The operator's kind if given; else a read only when the server says read-only."""
    if override.kind is not None:
        kind = ToolKind(override.kind)
        assert kind in USER_KINDS
        return kind
    hints = listed.annotations
    return ToolKind.READ if hints is not None and hints.read_only_hint is True else ToolKind.WRITE


class _CallWatch(sdk_http.AsyncGuardedTransport):
    """Notes whether the `tools/call` request was handed on, and what status answered it."""

    def __init__(self, headers: dict[str, str]) -> None:
        super().__init__(headers=headers)
        self.sent = False
        self.status: int | None = None

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        is_call = _rpc_method(await request.aread()) == "tools/call"
        self.sent = self.sent or is_call
        response = await super().handle_async_request(request)
        if is_call:
            self.status = response.status_code
        return response


def _rpc_method(body: bytes) -> str | None:
    try:
        parsed = json.loads(body) if body else None
    except ValueError:
        return None
    return parsed.get("method") if isinstance(parsed, dict) else None


@dataclass
class McpCall:
    """Calls one tool of one server for the engine: validation, then one `tools/call`."""

    server: ServerConfig
    tool: str
    name: str
    checker: Any = field(repr=False)

    def validate(self, args: dict[str, Any]) -> dict[str, Any]:
        """The arguments, or InvalidArguments listing what does not fit the tool's schema."""
        errors = sorted(self.checker.iter_errors(args), key=lambda e: list(e.absolute_path))
        if errors:
            problems = [
                {
                    "field": ".".join(str(p) for p in e.absolute_path) or "(arguments)",
                    "message": e.message,
                }
                for e in errors
            ]
            raise InvalidArguments(self.name, problems)
        return args

    def invoke(self, args: dict[str, Any], ctx: CallContext) -> Outcome:
        self.validate(args)
        try:
            headers = {**ctx.http.headers, **self.server.headers()}
        except ToolDeclarationError as exc:
            raise ToolError(f"{exc}; the call was not made") from None
        outcome: Outcome = run_coroutine(self._call(args, ctx, headers))
        return outcome

    async def _call(
        self, args: dict[str, Any], ctx: CallContext, headers: dict[str, str]
    ) -> Outcome:
        watch = _CallWatch(headers)
        client = httpx2.AsyncClient(transport=watch, timeout=httpx2.Timeout(ctx.timeout_s))
        meta: dict[str, Any] = {
            META_KEY: ctx.key,
            "liyagent/run_id": ctx.run_id,
            "liyagent/attempt": ctx.attempt,
            "liyagent/call": f"{ctx.step}:{ctx.call_id}",
        }
        request = types.CallToolRequest(
            params=types.CallToolRequestParams(
                name=self.tool, arguments=args, _meta=cast(types.RequestParamsMeta, meta)
            )
        )
        try:
            with http.total_timeout(ctx.timeout_s):
                async with client, _connect(self.server, client, ctx.timeout_s) as session:
                    # The session's own call_tool would list the tools again after a result to
                    # check its output schema: a request that can fail after the write landed.
                    result = await session.session.send_request(request, types.CallToolResult)
        except BaseException as exc:  # classified below, nothing swallowed
            failure = self._failure(exc, watch)
            if failure is exc or isinstance(failure, SendRefused | KeyboardInterrupt | SystemExit):
                raise failure from None
            raise failure from exc
        if result.is_error:
            raise ToolError(f"{self.name}: the MCP server said: {_text(result.content)[:500]}")
        return _outcome(result)

    def _failure(self, exc: BaseException, watch: _CallWatch) -> BaseException:
        """What a failed call means: stop (send guard), a definite refusal, or in doubt."""
        leaves = list(_leaves(exc))
        for leaf in leaves:
            if isinstance(leaf, SendRefused | KeyboardInterrupt | SystemExit):
                return leaf
        said = f"{self.name} (MCP server {self.server.name}): {_why(exc)}"
        if not watch.sent:  # its `tools/call` never left: it failed for certain
            return ToolFailed(f"{said}; the call was not made", exc)
        if watch.status is not None and 400 <= watch.status < 500:
            return ToolError(f"{said} (HTTP {watch.status})", watch.status)
        if watch.status is not None and watch.status < 400:
            codes = {leaf.code for leaf in leaves if isinstance(leaf, MCPError)}
            if codes and codes <= REFUSED_CODES:
                return ToolError(f"{said}; the server did not take the call")
        status = f" (HTTP {watch.status})" if watch.status is not None else ""
        return ToolInDoubt(f"{said}{status}")


def _leaves(exc: BaseException) -> Iterable[BaseException]:
    if isinstance(exc, BaseExceptionGroup):
        for inner in exc.exceptions:
            yield from _leaves(inner)
    else:
        yield exc


def _why(exc: BaseException) -> str:
    parts = []
    for leaf in _leaves(exc):
        if isinstance(leaf, MCPError):
            parts.append(f"MCP error {leaf.code}: {leaf.message}")
        else:
            parts.append(f"{type(leaf).__name__}: {leaf}" if str(leaf) else type(leaf).__name__)
    return "; ".join(dict.fromkeys(parts)) or type(exc).__name__


def _text(content: Sequence[Any]) -> str:
    return "\n".join(str(getattr(c, "text", "")) for c in content if getattr(c, "text", None))


def _outcome(result: types.CallToolResult) -> Outcome:
    """A result as the model is told it: its structured content, else its text, else its
    content blocks."""
    if isinstance(result.structured_content, dict):
        return dict(result.structured_content)
    if all(isinstance(c, types.TextContent) for c in result.content):
        return {"text": _text(result.content)}
    return {"content": [c.model_dump(mode="json", exclude_none=True) for c in result.content]}


__all__ = [
    "SETTING",
    "McpCall",
    "ServerConfig",
    "load_config",
    "server_tools",
    "sources",
    "to_tool",
]
