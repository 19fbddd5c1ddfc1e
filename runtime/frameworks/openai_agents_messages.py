"""liyagent's conversation as the OpenAI Agents SDK's input items (the Responses format its
models convert), for one step of a registered `agents.Agent`
(runtime/frameworks/openai_agents.py): the registry's tool names mapped back to the agent's,
a final answer refused for its type told as the user's message."""

from __future__ import annotations

import json
from typing import Any

from agents.items import ModelResponse, TResponseInputItem

from runtime.durable.state import Message
from runtime.models.base import Usage


def to_input_items(conversation: list[Message], prefix: str) -> list[TResponseInputItem]:
    """liyagent's conversation as the SDK's input items (the Responses format its models
    convert), the registry's tool names mapped back to the agent's."""
    out: list[Any] = []
    for i, message in enumerate(conversation):
        role = message.get("role")
        content = str(message.get("content") or "")
        if role == "assistant":
            if content:
                out.append(
                    {
                        "type": "message",
                        "role": "assistant",
                        "id": f"msg_{i}",
                        "status": "completed",
                        "content": [{"type": "output_text", "text": content, "annotations": []}],
                    }
                )
            for call in message.get("tool_calls") or []:
                raw = call.get("raw_args")
                name = str(call["name"])
                out.append(
                    {
                        "type": "function_call",
                        "call_id": str(call["id"]),
                        "name": name[len(prefix) :] if name.startswith(prefix) else name,
                        "arguments": raw
                        if isinstance(raw, str)
                        else json.dumps(call.get("args") or {}),
                    }
                )
        elif role == "tool":
            out.append(
                {
                    "type": "function_call_output",
                    "call_id": str(message["tool_call_id"]),
                    "output": content,
                }
            )
        elif role == "system":
            out.append({"role": "system", "content": content})
        else:  # the run's input, or a final answer refused for its type, told as the user's
            out.append({"role": "user", "content": content})
    return out


def usage_of(response: ModelResponse, asked: str | None) -> Usage | None:
    """The response's usage as the step ledger records it (store/usage.py): input (the cached
    part in `input_tokens_details`) and output tokens. The SDK's response does not carry the
    model the provider names, so the model is the one the agent asked for (`asked`). None when
    it measured nothing (a provider that sent no usage)."""
    usage = response.usage
    if usage.input_tokens <= 0 and usage.output_tokens <= 0:
        return None
    details = usage.input_tokens_details
    cached = getattr(details, "cached_tokens", 0) if details is not None else 0
    return Usage(
        usage.input_tokens,
        usage.output_tokens,
        cached_tokens=cached if isinstance(cached, int) and cached > 0 else 0,
        model=asked,
    )
