"""The built-in `remote.ask` tool's A2A client (the `a2a` extra): SendMessage to the remote agent
and GetTask by the call's key, over a guarded httpx client of the engine's, so every request
passes the send guard; a refusal is a `ToolError`, anything else in doubt (`ToolInDoubt`)."""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import httpx
from a2a.client import Client, ClientCallContext, ClientConfig, ClientFactory
from a2a.client.errors import A2AClientError
from a2a.types import (
    AgentCapabilities,
    AgentCard,
    AgentInterface,
    GetTaskRequest,
    InternalError,
    Message,
    Part,
    Role,
    SendMessageRequest,
    Task,
    TaskNotFoundError,
    TaskState,
)
from a2a.utils.errors import A2AError

from liyagent import CallContext, ToolError, ToolInDoubt
from runtime.sending import http

T = TypeVar("T")
DEFAULT_URL = "http://127.0.0.1:8765"


def _url(path: str) -> str:
    return (os.environ.get("LIYAGENT_VENDOR_URL") or DEFAULT_URL).rstrip("/") + path


def _remote_url() -> str:
    """The remote agent's A2A JSON-RPC endpoint (`LIYAGENT_A2A_REMOTE_URL`, by default the
    simulators' remote agent), read at call time."""
    return os.environ.get("LIYAGENT_A2A_REMOTE_URL") or _url("/a2a")


async def _with_a2a(
    ctx: CallContext, work: Callable[[Client, ClientCallContext], Awaitable[T]]
) -> T:
    """Run `work` with the A2A SDK's client for the remote agent, over a guarded httpx client
    of the engine's (so every request passes the send guard), sending the call's key and
    identity headers, within the call's timeout."""
    card = AgentCard(
        name="remote-agent",
        supported_interfaces=[
            AgentInterface(url=_remote_url(), protocol_binding="JSONRPC", protocol_version="1.0")
        ],
        capabilities=AgentCapabilities(streaming=False),
    )
    call_ctx = ClientCallContext(service_parameters=dict(ctx.http.headers), timeout=ctx.timeout_s)
    async with http.new_async_client(ctx.timeout_s) as client:
        a2a = ClientFactory(ClientConfig(httpx_client=client, streaming=False)).create(card)
        try:
            with http.total_timeout(ctx.timeout_s):
                return await work(a2a, call_ctx)
        except A2AError as exc:
            raise _a2a_failure(exc) from exc


def _a2a_failure(exc: A2AError) -> Exception:
    """A definite refusal (`ToolError`: a 4xx or a protocol error the agent answered), or a
    call left in doubt (a timeout, a lost connection, a 5xx, the agent's internal error)."""
    cause = exc.__cause__
    said = f"A2A {type(exc).__name__}: {exc}"
    if isinstance(cause, httpx.HTTPStatusError):
        status = cause.response.status_code
        return ToolInDoubt(said) if status >= 500 else ToolError(said, status)
    if isinstance(exc, A2AClientError | InternalError):
        return ToolInDoubt(said)
    return ToolError(said)


def _outcome(task: Task) -> dict[str, Any]:
    answer = "\n".join(p.text for a in task.artifacts for p in a.parts if p.text)
    return {
        "task_id": task.id,
        "context_id": task.context_id,
        "state": TaskState.Name(task.status.state).removeprefix("TASK_STATE_").lower(),
        "answer": answer or None,
    }


async def send(ctx: CallContext, message: str, agent: str) -> dict[str, Any]:
    request = SendMessageRequest(
        message=Message(
            message_id=ctx.key,
            role=Role.ROLE_USER,
            parts=[Part(text=message)],
            metadata={"skill": agent},
        )
    )

    async def send(a2a: Client, call_ctx: ClientCallContext) -> dict[str, Any]:
        async for event in a2a.send_message(request, context=call_ctx):
            if event.HasField("task"):
                return _outcome(event.task)
            return {"answer": "\n".join(p.text for p in event.message.parts if p.text)}
        raise ToolInDoubt("A2A SendMessage: the agent answered nothing")

    return await _with_a2a(ctx, send)


async def get_task(ctx: CallContext) -> dict[str, Any] | None:
    async def get(a2a: Client, call_ctx: ClientCallContext) -> dict[str, Any] | None:
        try:
            return _outcome(await a2a.get_task(GetTaskRequest(id=ctx.key), context=call_ctx))
        except TaskNotFoundError:
            return None

    return await _with_a2a(ctx, get)
