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
from typing import Annotated, Any, Literal, TypeVar

from pydantic import Field

from liyagent import (
    CallContext,
    InvalidArguments,
    Tool,
    ToolKind,
    tool,
    vendor_json,
)
from runtime.base.extras import need
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


def _a2a_client() -> Any:
    """The remote agent's A2A client (liyagent/vendor_remote.py), with the `a2a` extra: the
    other vendor tools load without it."""
    return need("a2a", "liyagent.vendor_remote")


def _remote_ask(args: dict[str, Any], ctx: CallContext) -> dict[str, Any]:
    """SendMessage to the remote agent; the message id is the call's key, and the agent names
    the task after it, so the task can be read back by that id."""
    remote = _a2a_client()
    outcome: dict[str, Any] = run_coroutine(
        remote.send(ctx, args["message"], args.get("agent") or "remote-agent")
    )
    return outcome


def _remote_read_back(args: dict[str, Any], ctx: CallContext) -> dict[str, Any] | None:
    """The remote task this call created (GetTask by the call's key); None if it never landed."""
    found: dict[str, Any] | None = run_coroutine(_a2a_client().get_task(ctx))
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
