"""liyagent's conversation as Pydantic AI's messages, for one step of a registered
`pydantic_ai.Agent` (runtime/frameworks/pydantic_ai.py): the registry's tool names mapped back
to the agent's, a final answer refused for its type told back as Pydantic AI tells a retry, and
the agent's instructions on the last request, as Pydantic AI sends them."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from pydantic_ai import messages

from runtime.durable.state import Message
from runtime.models.base import Usage


def to_model_messages(
    conversation: list[Message], prefix: str, instructions: str | None
) -> list[messages.ModelMessage]:
    """liyagent's conversation as Pydantic AI's messages (the registry's tool names mapped
    back to the agent's), its instructions on the last request, as Pydantic AI sends them."""
    out: list[messages.ModelMessage] = []
    parts: list[Any] = []

    def flush() -> None:
        if parts:
            out.append(messages.ModelRequest(parts=list(parts)))
            parts.clear()

    framework = _framework_name(prefix)
    for message in conversation:
        role = message.get("role")
        if role == "assistant":
            flush()
            out.append(messages.ModelResponse(parts=_response_parts(message, framework)))
        elif role == "tool":
            parts.append(_tool_part(message, framework))
        elif role == "system":
            parts.append(messages.SystemPromptPart(content=str(message.get("content") or "")))
        elif message.get("retry"):  # a final answer refused for its type, told as feedback
            parts.append(
                messages.RetryFeedbackPart(
                    content=str(message.get("content") or ""),
                    retry=messages.RetryInfo(cause="model_retry"),
                )
            )
        else:
            parts.append(messages.UserPromptPart(content=str(message.get("content") or "")))
    flush()
    if instructions and out and isinstance(out[-1], messages.ModelRequest):
        out[-1].instructions = instructions
    return out


def _framework_name(prefix: str) -> Callable[[str], str]:
    def name(registry: str) -> str:
        return registry[len(prefix) :] if registry.startswith(prefix) else registry

    return name


def _response_parts(message: Message, name: Callable[[str], str]) -> list[Any]:
    parts: list[Any] = []
    if message.get("content"):
        parts.append(messages.TextPart(content=str(message["content"])))
    for call in message.get("tool_calls") or []:
        raw = call.get("raw_args")
        parts.append(
            messages.ToolCallPart(
                tool_name=name(str(call["name"])),
                args=raw if isinstance(raw, str) else dict(call.get("args") or {}),
                tool_call_id=str(call["id"]),
            )
        )
    return parts


def _tool_part(message: Message, name: Callable[[str], str]) -> Any:
    tool = name(str(message.get("name") or ""))
    content = str(message.get("content") or "")
    try:
        value: Any = json.loads(content)
    except ValueError:
        value = content
    if message.get("retry"):  # the output tool's call refused for its type
        return messages.ToolReturnPart(
            tool_name=tool,
            content=value,
            tool_call_id=str(message["tool_call_id"]),
            outcome="retried",
            retry=messages.RetryInfo(cause="validation_error"),
        )
    return messages.ToolReturnPart(
        tool_name=tool, content=value, tool_call_id=str(message["tool_call_id"])
    )


def usage_of(response: messages.ModelResponse) -> Usage | None:
    """The response's usage as the step ledger records it (store/usage.py): Pydantic AI counts
    the input with the cache's reads and writes in it, the reads as `cache_read_tokens`, as
    liyagent does; the model its response names. None when it measured nothing (no input, no
    output: a provider that sent no usage)."""
    usage = response.usage
    if usage.input_tokens <= 0 and usage.output_tokens <= 0:
        return None
    return Usage(
        usage.input_tokens,
        usage.output_tokens,
        cached_tokens=max(usage.cache_read_tokens, 0),
        model=response.model_name or None,
    )
