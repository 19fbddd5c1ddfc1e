"""liyagent's conversation as the OpenAI Agents SDK's input items (the Responses format its
models convert), for one step of a registered `agents.Agent`
(runtime/frameworks/openai_agents.py): the registry's tool names mapped back to the agent's,
a final answer refused for its type told as the user's message."""

from __future__ import annotations

import json
from typing import Any

from agents.items import TResponseInputItem

from runtime.durable.state import Message


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
