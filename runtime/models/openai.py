"""A provider for OpenAI-compatible chat-completions endpoints: one HTTP request per step.

The endpoint and where its key is are the deployment's model profile's (`profiles.py`); the key
is read at call time, so it is never stored with the run. The HTTP client does not retry;
`classify` turns each failure into a ModelError and the engine decides to ask again.
"""

from __future__ import annotations

import json
import re
from typing import Any

import httpx

from runtime.durable.state import Message, ToolCall
from runtime.models.base import ModelError, StepAnswer, StepRequest, Usage
from runtime.models.errors import classify, too_large
from runtime.models.profiles import ModelProfile
from runtime.models.specs import OpenAISpec
from runtime.sending import bounded, http

# Seconds one chat-completions request may take when neither the spec nor its profile says.
DEFAULT_TIMEOUT_S = 30.0

# What OpenAI accepts as a function name; our registry's dotted names are mapped onto it.
_WIRE_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")


def wire_name(name: str) -> str:
    """A tool's name as the provider sees it: dots become double underscores."""
    return name.replace(".", "__")


def tool_name(wire: str) -> str:
    """A provider function name mapped back to our tool name: double underscores become dots."""
    return wire.replace("__", ".")


def checked_wire_name(name: str, provider: str = "an OpenAI-compatible model") -> str:
    """The wire name, refused when the provider would reject it or it would not map back."""
    wire = wire_name(name)
    if not _WIRE_NAME.match(wire) or tool_name(wire) != name:
        raise ModelError(
            f"tool {name!r} cannot be offered to {provider}: its name must use "
            "only letters, digits, '-', '_' and '.', without '__' or '_' next to '.', "
            "at most 64 characters",
            retryable=False,
        )
    return wire


def to_chat_messages(messages: list[Message]) -> list[dict[str, Any]]:
    """Our conversation in chat-completions form (assistant tool calls, tool results)."""
    return [_chat_message(m) for m in messages]


def _chat_message(message: Message) -> dict[str, Any]:
    role = message.get("role")
    if role == "assistant":
        out: dict[str, Any] = {"role": "assistant", "content": message.get("content")}
        calls = message.get("tool_calls") or []
        if calls:  # an empty list is refused by the API, so it is left out
            out["tool_calls"] = [_chat_tool_call(c) for c in calls]
        return out
    if role == "tool":
        return {
            "role": "tool",
            "tool_call_id": message["tool_call_id"],
            "content": message.get("content") or "",
        }
    return {"role": role, "content": message.get("content")}


def _chat_tool_call(call: dict[str, Any]) -> dict[str, Any]:
    raw = call.get("raw_args")  # arguments that could not be read go back as the model sent them
    return {
        "id": call["id"],
        "type": "function",
        "function": {
            "name": checked_wire_name(str(call["name"])),
            "arguments": raw
            if isinstance(raw, str)
            else json.dumps(call.get("args") or {}, sort_keys=True),
        },
    }


def to_chat_tools(tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Our tool schemas as chat-completions function tools, under their wire names."""
    return [
        {
            "type": "function",
            "function": {
                "name": checked_wire_name(str(t["name"])),
                "description": t.get("description") or "",
                "parameters": t.get("parameters") or {"type": "object"},
            },
        }
        for t in tools
    ]


class OpenAIProvider:
    """Answers each step with one chat-completions request to the endpoint of the deployment's
    profile its spec names (the key read from where that profile says, at each call)."""

    name = "openai"

    def __init__(self, config: OpenAISpec, endpoint: ModelProfile) -> None:
        self.config = config
        self.endpoint = endpoint
        self.timeout_s = config.timeout(endpoint, DEFAULT_TIMEOUT_S)

    def next_step(self, request: StepRequest) -> StepAnswer:
        key = self.endpoint.key()
        body = self.request_body(request)
        return parse_answer(request.run_id, self._post(key, body, request.headers()))

    def request_body(self, request: StepRequest) -> dict[str, Any]:
        """The chat-completions request for one step."""
        body: dict[str, Any] = {
            "model": self.config.model_name(self.endpoint),
            "messages": to_chat_messages(request.messages),
        }
        if request.tools:  # an empty tools list is refused by the API
            body["tools"] = to_chat_tools(request.tools)
        if self.config.temperature is not None:
            body["temperature"] = self.config.temperature
        # The run's max_tokens, else its profile's: what the ledger and budgets reserve as
        # the most a request generates is what the provider is told (runtime/core/ledger.py).
        most = self.config.max_tokens or self.endpoint.max_tokens
        if most is not None:
            body["max_tokens"] = most
        return body

    def _post(self, key: str, body: dict[str, Any], extra: dict[str, str]) -> dict[str, Any]:
        """One POST with no client-side retries; any failure comes back classified. The answer
        is read as a stream and given up past the bound on answers (`bounded`)."""
        url = f"{self.endpoint.base_url}/chat/completions"
        headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
        headers.update(extra)
        run_id = extra.get("X-Liyagent-Run", "")
        # The process's pooled client: keep-alive across steps, the send guard on every request.
        try:
            with http.shared_client().stream(
                "POST",
                url,
                headers=headers,
                content=json.dumps(body),
                timeout=self.timeout_s,
            ) as response:
                if not response.is_success:
                    raise classify(
                        response.status_code,
                        response.headers,
                        None,
                        body=bounded.prefix(response).decode(errors="replace"),
                        key_env=self.endpoint.key_source,
                    )
                raw = bounded.read(response, bounded.answer_limit())
        except bounded.ResponseTooLarge as exc:
            raise too_large(run_id, exc) from None
        except (httpx.HTTPError, httpx.InvalidURL) as exc:
            raise classify(None, None, exc, key_env=self.endpoint.key_source) from exc
        return _json_object(raw, response.headers.get("content-type"))


def _json_object(raw: bytes, content_type: str | None) -> dict[str, Any]:
    try:
        parsed = json.loads(raw)
    except ValueError:
        parsed = None
    if not isinstance(parsed, dict):
        # The body itself is not quoted: it may hold anything, the prompt included.
        raise ModelError(
            f"the model provider answered HTTP 200 with a body that is not a JSON object "
            f"({len(raw)} bytes of {content_type or 'no content type'}); check base_url",
            retryable=False,
        )
    return parsed


def parse_answer(run_id: str, payload: dict[str, Any]) -> StepAnswer:
    """The step's answer from a chat-completions response: tool calls, else final text."""
    choices = payload.get("choices")
    first = choices[0] if isinstance(choices, list) and choices else None
    message = first.get("message") if isinstance(first, dict) else None
    if not isinstance(message, dict):
        raise ModelError(
            f"run {run_id}: the model's response has no choices[0].message", retryable=False
        )
    text = _content_text(message)
    raw_calls = message.get("tool_calls") or []
    if not isinstance(raw_calls, list):
        raise ModelError(f"run {run_id}: the model's tool_calls is not a list", retryable=False)
    calls = [_tool_call(run_id, c) for c in raw_calls]
    return StepAnswer(text=text, calls=calls, usage=usage_of(payload))


def usage_of(payload: dict[str, Any]) -> Usage | None:
    """The response's `usage` (`prompt_tokens`, which include the cached
    `prompt_tokens_details.cached_tokens`, and `completion_tokens`) with the `model` it names,
    or None when it has none."""
    usage = payload.get("usage")
    if not isinstance(usage, dict):
        return None
    sent, made = tokens(usage.get("prompt_tokens")), tokens(usage.get("completion_tokens"))
    if sent is None or made is None:
        return None
    details = usage.get("prompt_tokens_details")
    cached = tokens(details.get("cached_tokens")) if isinstance(details, dict) else None
    return Usage(sent, made, cached_tokens=cached or 0, model=model_of(payload))


def tokens(n: Any) -> int | None:
    """`n` as a token count (a whole number, not negative, not a bool), else None."""
    return n if isinstance(n, int) and not isinstance(n, bool) and n >= 0 else None


def model_of(payload: dict[str, Any]) -> str | None:
    """The model the response says answered, when it says (text, bounded as a name)."""
    model = payload.get("model")
    return model[:200] if isinstance(model, str) and model else None


def _content_text(message: dict[str, Any]) -> str | None:
    """The message's text; a refusal counts as its text, and text parts are joined."""
    content = message.get("content")
    if isinstance(content, list):
        content = "".join(
            str(p.get("text", ""))
            for p in content
            if isinstance(p, dict) and p.get("type") == "text"
        )
    if isinstance(content, str) and content:
        return content
    refusal = message.get("refusal")
    return refusal if isinstance(refusal, str) and refusal else None


def _tool_call(run_id: str, raw: Any) -> ToolCall:
    function = raw.get("function") if isinstance(raw, dict) else None
    call_id = raw.get("id") if isinstance(raw, dict) else None
    if not isinstance(function, dict) or not isinstance(call_id, str) or not call_id:
        raise ModelError(
            f"run {run_id}: the model asked for a tool call without an id or function",
            retryable=False,
        )
    name = function.get("name")
    if not isinstance(name, str) or not name:
        raise ModelError(f"run {run_id}: tool call {call_id} has no function name", retryable=False)
    text = function.get("arguments")
    if text is None or (isinstance(text, str) and not text.strip()):
        return ToolCall(id=call_id, name=tool_name(name), args={})  # "" for no parameters
    if not isinstance(text, str):
        raise ModelError(
            f"run {run_id}: tool call {call_id} has arguments that are not a JSON string",
            retryable=False,
        )
    args, error = read_arguments(text)
    raw_args = None if error is None else text
    return ToolCall(
        id=call_id, name=tool_name(name), args=args, args_error=error, raw_args=raw_args
    )


def read_arguments(raw: str) -> tuple[dict[str, Any], str | None]:
    """A model's arguments text as an object, or why it is not one: the model wrote them, so
    it is told and tries again (the step limit bounds it); the run does not fail."""
    try:
        args = json.loads(raw)
    except ValueError as exc:
        return {}, f"the arguments are not valid JSON ({exc})"
    if not isinstance(args, dict):
        return {}, f"the arguments are a JSON {type(args).__name__}, not an object"
    return args, None
