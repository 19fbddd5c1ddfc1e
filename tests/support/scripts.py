"""Scripts for the scripted model, shared by the integration and kill tests."""

from __future__ import annotations

from typing import Any


def call(call_id: str, tool: str, **args: Any) -> dict[str, Any]:
    return {"id": call_id, "tool": tool, "args": args}


def raw_call(call_id: str, tool: str, arguments: str) -> dict[str, Any]:
    """A call whose arguments the model sends as this raw text (broken JSON, say)."""
    return {"id": call_id, "tool": tool, "arguments": arguments}


def step(*calls: dict[str, Any], latency_ms: int = 0) -> dict[str, Any]:
    return {"calls": list(calls), "latency_ms": latency_ms}


def final(text: str = "Done.", latency_ms: int = 0) -> dict[str, Any]:
    return {"final": text, "latency_ms": latency_ms}


def mixed(tag: str, latency_ms: int = 0) -> list[dict[str, Any]]:
    """A read and a keyed write, then a write with a reader, then one without: every kind."""
    return [
        step(
            call(f"toolu_{tag}_r", "ticket.read", ticket=f"T-{tag}"),
            call(f"toolu_{tag}_i", "incident.create", title=f"Outage {tag}"),
            latency_ms=latency_ms,
        ),
        step(
            call(f"toolu_{tag}_c", "issue.comment", issue=f"ENG-{tag}", body="Investigating"),
            latency_ms=latency_ms,
        ),
        step(
            call(f"toolu_{tag}_m", "chat.reply", conversation=f"conv-{tag}", text="On it"),
            latency_ms=latency_ms,
        ),
        final(f"Handled {tag}.", latency_ms=latency_ms),
    ]
