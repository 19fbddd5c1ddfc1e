"""The built-in vendor tools: one of every kind the engine makes and settles, aimed at the
vendor simulators (`python -m simulators`) or any service with the same HTTP shape.

A tool module like any user's (`LIYAGENT_TOOLS=liyagent.vendor_tools`). The vendors' base URL
comes from `LIYAGENT_VENDOR_URL` (default http://127.0.0.1:8765), read at call time. Every
request goes through `ctx.http`, which sends the step's idempotency key and passes the send
guard; `remote.ask` is an A2A client (the `a2a-sdk` client, JSON-RPC binding) over a guarded
httpx client of the engine's, with the same headers.
"""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable
from typing import Annotated, Any, Literal, TypeVar

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
from pydantic import Field

from liyagent import (
    CallContext,
    InvalidArguments,
    Tool,
    ToolError,
    ToolInDoubt,
    ToolKind,
    tool,
    vendor_json,
)
from runtime.sending import http
from runtime.toolbox.coroutines import run_coroutine

T = TypeVar("T")

DEFAULT_URL = "http://127.0.0.1:8765"
# How long the incident tracker dedupes a create or an update on its key (a day), and the chat
# notifier its nonce (minutes: too short to send again after a resume, so it is settled).
INCIDENT_DEDUPE_S = 86400.0
NOTIFY_DEDUPE_S = 300.0

Severity = Literal["sev1", "sev2", "sev3", "sev4"]


def _url(path: str) -> str:
    return (os.environ.get("LIYAGENT_VENDOR_URL") or DEFAULT_URL).rstrip("/") + path


def _get(ctx: CallContext, path: str, **params: Any) -> Any:
    return vendor_json(f"GET {path}", lambda: ctx.http.get(_url(path), params=params or None))


def _post(ctx: CallContext, path: str, body: dict[str, Any]) -> Any:
    return vendor_json(f"POST {path}", lambda: ctx.http.post(_url(path), json=body))


@tool.read(name="ticket.read")
def ticket_read(ctx: CallContext, ticket: str) -> dict[str, Any]:
    """Read a ticket by id."""
    return dict(_get(ctx, f"/tickets/{ticket}"))


@tool.keyed_write(name="incident.create", dedupe_window_s=INCIDENT_DEDUPE_S)
def incident_create(ctx: CallContext, title: str, severity: Severity = "sev3") -> dict[str, Any]:
    """Open an incident (the tracker dedupes on the key for a day)."""
    return dict(_post(ctx, "/incidents", {"title": title, "severity": severity}))


@tool.keyed_write(name="incident.update", dedupe_window_s=INCIDENT_DEDUPE_S)
def incident_update(
    ctx: CallContext, incident: Annotated[int, Field(ge=1)], body: str
) -> dict[str, Any]:
    """Post an update to an open incident (the tracker dedupes on the key for a day)."""
    return dict(_post(ctx, f"/incidents/{incident}/updates", {"body": body}))


@tool.approval_write(name="incident.page", dedupe_window_s=INCIDENT_DEDUPE_S)
def incident_page(ctx: CallContext, title: str, severity: Severity = "sev2") -> dict[str, Any]:
    """Page on-call with a new incident; held for a person's approval, then sent with the
    approval id as its key."""
    return dict(_post(ctx, "/incidents", {"title": title, "severity": severity}))


@tool.write(name="issue.comment")
def issue_comment(ctx: CallContext, issue: str, body: str) -> dict[str, Any]:
    """Comment on an issue."""
    return dict(_post(ctx, f"/issues/{issue}/comments", {"body": body}))


@issue_comment.read_back
def find_issue_comment(ctx: CallContext, issue: str, body: str) -> dict[str, Any] | None:
    """The comment this call's key made, if the tracker has it."""
    found = _get(ctx, "/comments", key=ctx.key)
    return dict(found[0]) if found else None


@tool.write(name="chat.reply")
def chat_reply(
    ctx: CallContext, conversation: str, text: str, cards: list[dict[str, Any]] | None = None
) -> dict[str, Any]:
    """Post a chat reply (no reader: a reply in doubt is reported, never posted again)."""
    body = {"conversation": conversation, "text": text, "cards": cards or []}
    return dict(_post(ctx, "/chat/replies", body))


@tool.keyed_write(name="notify.send", dedupe_window_s=NOTIFY_DEDUPE_S)
def notify_send(ctx: CallContext, channel: str, text: str) -> dict[str, Any]:
    """Send a channel notification (its nonce dedupes for minutes only)."""
    return dict(_post(ctx, "/notify", {"channel": channel, "text": text}))


@tool.keyed_write(name="finetune.submit", dedupe_window_s=INCIDENT_DEDUPE_S)
def finetune_submit(
    ctx: CallContext, model: str, dataset: str, duration_s: float = 2.0
) -> dict[str, Any]:
    """Submit a fine-tuning job."""
    body = {"model": model, "dataset": dataset, "duration_s": duration_s}
    return dict(_post(ctx, "/fine_tunes", body))


@tool.read(name="finetune.status")
def finetune_status(ctx: CallContext, id: str) -> dict[str, Any]:
    """Read a fine-tuning job."""
    return dict(_get(ctx, f"/fine_tunes/{id}"))


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


async def _send(ctx: CallContext, message: str, agent: str) -> dict[str, Any]:
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


async def _get_task(ctx: CallContext) -> dict[str, Any] | None:
    async def get(a2a: Client, call_ctx: ClientCallContext) -> dict[str, Any] | None:
        try:
            return _outcome(await a2a.get_task(GetTaskRequest(id=ctx.key), context=call_ctx))
        except TaskNotFoundError:
            return None

    return await _with_a2a(ctx, get)


def _remote_ask(args: dict[str, Any], ctx: CallContext) -> dict[str, Any]:
    """SendMessage to the remote agent; the message id is the call's key, and the agent names
    the task after it, so the task can be read back by that id."""
    outcome: dict[str, Any] = run_coroutine(
        _send(ctx, args["message"], args.get("agent") or "remote-agent")
    )
    return outcome


def _remote_read_back(args: dict[str, Any], ctx: CallContext) -> dict[str, Any] | None:
    """The remote task this call created (GetTask by the call's key); None if it never landed."""
    found: dict[str, Any] | None = run_coroutine(_get_task(ctx))
    return found


def _remote_args(args: dict[str, Any]) -> dict[str, Any]:
    if not isinstance(args.get("message"), str) or not args["message"].strip():
        raise InvalidArguments("remote.ask", [{"field": "message", "message": "text required"}])
    return args


# A remote agent is a kind the engine settles itself (by reading the task back), so it is
# declared as a `Tool` with its invoke and reader, rather than with a decorator.
remote_ask = Tool(
    "remote.ask",
    ToolKind.REMOTE_AGENT,
    "Ask another agent over A2A (SendMessage); its task is found again by id after a crash.",
    _remote_ask,
    reader=_remote_read_back,
    parameters={
        "type": "object",
        "properties": {"message": {"type": "string"}, "agent": {"type": "string"}},
        "required": ["message"],
    },
    validate=_remote_args,
)


__all__ = [
    "chat_reply",
    "find_issue_comment",
    "finetune_status",
    "finetune_submit",
    "incident_create",
    "incident_page",
    "incident_update",
    "issue_comment",
    "notify_send",
    "remote_ask",
    "ticket_read",
]
