"""Built-in tools that call vendors over HTTP (the simulators in tests and the demo).

Every request carries the step's idempotency key and the run and attempt that sent it, so the
vendor's own records can judge duplicates and stale writes.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import httpx

from runtime.tools import CallContext, Tool, ToolError, ToolInDoubt, ToolKind, ToolRegistry


class VendorRefused(ToolError):
    """The vendor answered 4xx: a definite outcome, with its status."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status


class VendorClient:
    """A small HTTP client that turns vendor answers into outcomes, errors or doubt."""

    def __init__(self, base_url: str) -> None:
        self.base_url = base_url.rstrip("/")

    def request(
        self, method: str, path: str, ctx: CallContext, body: dict[str, Any] | None = None
    ) -> Any:
        headers = {
            "Idempotency-Key": ctx.key,
            "X-Liyagent-Run": ctx.run_id,
            "X-Liyagent-Attempt": str(ctx.attempt),
        }
        try:
            response = httpx.request(
                method, self.base_url + path, json=body, headers=headers, timeout=ctx.timeout_s
            )
        except (httpx.TimeoutException, httpx.NetworkError, httpx.RemoteProtocolError) as exc:
            raise ToolInDoubt(f"{method} {path}: {type(exc).__name__}: {exc}") from exc
        except httpx.HTTPError as exc:
            raise ToolError(f"{method} {path}: {exc}") from exc
        if response.status_code >= 500:
            raise ToolInDoubt(f"{method} {path}: vendor answered {response.status_code}")
        if response.status_code >= 400:
            raise VendorRefused(
                f"{method} {path}: {response.status_code} {response.text[:300]}",
                response.status_code,
            )
        return response.json()


def _require(args: dict[str, Any], name: str) -> Any:
    value = args.get(name)
    if value in (None, ""):
        raise ToolError(f"argument {name!r} is required")
    return value


def _engine_routed(args: dict[str, Any], ctx: CallContext) -> dict[str, Any]:
    raise ToolError("a delegation is routed by the engine, never invoked directly")


def vendor_tools(
    base_url: str, incident_dedupe_s: float, notify_dedupe_s: float = 300
) -> list[Tool]:
    """The vendor tools: one of every kind the engine knows how to make and settle."""
    client = VendorClient(base_url)

    def ticket_read(args: dict[str, Any], ctx: CallContext) -> dict[str, Any]:
        ticket = _require(args, "ticket")
        return dict(client.request("GET", f"/tickets/{ticket}", ctx))

    def incident_create(args: dict[str, Any], ctx: CallContext) -> dict[str, Any]:
        body = {"title": _require(args, "title"), "severity": args.get("severity", "sev3")}
        return dict(client.request("POST", "/incidents", ctx, body))

    def comment_create(args: dict[str, Any], ctx: CallContext) -> dict[str, Any]:
        issue, text = _require(args, "issue"), _require(args, "body")
        return dict(client.request("POST", f"/issues/{issue}/comments", ctx, {"body": text}))

    def comment_read_back(args: dict[str, Any], ctx: CallContext) -> dict[str, Any] | None:
        found = client.request("GET", f"/comments?key={ctx.key}", ctx)
        return dict(found[0]) if found else None

    def chat_reply(args: dict[str, Any], ctx: CallContext) -> dict[str, Any]:
        body = {
            "conversation": _require(args, "conversation"),
            "text": _require(args, "text"),
            "cards": args.get("cards", []),
        }
        return dict(client.request("POST", "/chat/replies", ctx, body))

    def notify(args: dict[str, Any], ctx: CallContext) -> dict[str, Any]:
        body = {"channel": _require(args, "channel"), "text": _require(args, "text")}
        return dict(client.request("POST", "/notify", ctx, body))

    def remote_ask(args: dict[str, Any], ctx: CallContext) -> dict[str, Any]:
        body = {
            "id": ctx.key,
            "message": _require(args, "message"),
            "agent": args.get("agent", "remote-agent"),
        }
        return dict(client.request("POST", "/a2a/tasks", ctx, body))

    def remote_read_back(args: dict[str, Any], ctx: CallContext) -> dict[str, Any] | None:
        try:
            return dict(client.request("GET", f"/a2a/tasks/{ctx.key}", ctx))
        except VendorRefused as exc:
            if exc.status == 404:
                return None
            raise

    def finetune_submit(args: dict[str, Any], ctx: CallContext) -> dict[str, Any]:
        body = {
            "model": _require(args, "model"),
            "dataset": _require(args, "dataset"),
            "duration_s": args.get("duration_s", 2),
        }
        return dict(client.request("POST", "/fine_tunes", ctx, body))

    def finetune_status(args: dict[str, Any], ctx: CallContext) -> dict[str, Any]:
        return dict(client.request("GET", f"/fine_tunes/{_require(args, 'id')}", ctx))

    return [
        Tool("ticket.read", ToolKind.READ, "Read a ticket by id.", ticket_read),
        Tool(
            "finetune.submit",
            ToolKind.KEYED_WRITE,
            "Submit a fine-tuning job.",
            finetune_submit,
            dedupe_window_s=incident_dedupe_s,
        ),
        Tool("finetune.status", ToolKind.READ, "Read a fine-tuning job.", finetune_status),
        Tool(
            "notify.send",
            ToolKind.KEYED_WRITE,
            "Send a channel notification (nonce dedupe for minutes only).",
            notify,
            dedupe_window_s=notify_dedupe_s,
        ),
        Tool(
            "incident.page",
            ToolKind.APPROVAL_WRITE,
            "Page on-call with a new incident; held for a person's approval.",
            incident_create,
            dedupe_window_s=incident_dedupe_s,
        ),
        Tool("agent.delegate", ToolKind.DELEGATION, "Ask a sub-agent.", _engine_routed),
        Tool(
            "remote.ask",
            ToolKind.REMOTE_AGENT,
            "Ask another agent over A2A.",
            remote_ask,
            reader=remote_read_back,
        ),
        Tool(
            "incident.create",
            ToolKind.KEYED_WRITE,
            "Open an incident.",
            incident_create,
            dedupe_window_s=incident_dedupe_s,
        ),
        Tool(
            "issue.comment",
            ToolKind.WRITE,
            "Comment on an issue.",
            comment_create,
            reader=comment_read_back,
        ),
        Tool("chat.reply", ToolKind.WRITE, "Post a chat reply.", chat_reply),
    ]


def default_registry(
    base_url: str, kinds: dict[str, str] | None = None, incident_dedupe_s: float = 86400
) -> ToolRegistry:
    """The built-in tools, with operators' reclassifications (`LIYAGENT_TOOL_KINDS`) applied."""
    tools = vendor_tools(base_url, incident_dedupe_s)
    overrides = dict(kinds or {})
    unknown = set(overrides) - {t.name for t in tools}
    if unknown:
        raise ValueError(f"LIYAGENT_TOOL_KINDS names unknown tools: {sorted(unknown)}")
    return ToolRegistry(
        [replace(t, kind=ToolKind(overrides[t.name])) if t.name in overrides else t for t in tools]
    )
