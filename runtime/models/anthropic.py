"""A provider for the Anthropic Messages API: one `messages.create` per step, official SDK.

The SDK's own retries are off (`max_retries=0`): every failure comes back as a ModelError from
the engine's one classifier (`errors.classify`, which knows 529 overloaded is worth asking
again) and the engine decides. Its HTTP goes through the process's guarded pooled client
(`sdk_http.py`), so the send guard applies to model calls too. The endpoint and the key's
source are the deployment's model profile's (`profiles.py`; built in: ANTHROPIC_API_KEY).

Our conversation maps onto the Messages API: system prompts go in `system`; an assistant step
is its text and `tool_use` blocks (the provider's `toolu_...` ids are kept: they are stable, so
they give stable step keys); tool results are `tool_result` blocks in the next user turn,
consecutive ones merged into one turn. Dotted tool names are offered under wire names
(`ticket.read` as `ticket__read`) and mapped back.
"""

from __future__ import annotations

import json
from typing import Any

import anthropic
import httpx2

from runtime.durable.state import Message, ToolCall
from runtime.models.base import ModelError, StepAnswer, StepRequest, Usage
from runtime.models.errors import classify, too_large
from runtime.models.openai import checked_wire_name, model_of, tokens, tool_name
from runtime.models.profiles import ModelProfile
from runtime.models.specs import AnthropicSpec
from runtime.sending import bounded, http, sdk_http
from runtime.sending.http import SendRefused

PROVIDER = "an Anthropic model"
# What a request may take, and the most tokens a step generates, when neither the spec nor its
# profile says (the API requires max_tokens).
DEFAULT_TIMEOUT_S = 60.0
DEFAULT_MAX_TOKENS = 1024
# The SDK adds /v1/messages itself, so a base_url ending in /v1 is the usual 404.
HINTS = {404: "check base_url (the host only, e.g. https://api.anthropic.com) and the model name"}

Block = dict[str, Any]


def to_messages(messages: list[Message]) -> tuple[str | None, list[dict[str, Any]]]:
    """Our conversation as the Messages API takes it: the system text, and turns that
    alternate user / assistant (consecutive turns of one role merged, tool results first)."""
    system = [str(m.get("content") or "") for m in messages if m.get("role") == "system"]
    turns: list[dict[str, Any]] = []
    for message in messages:
        role = message.get("role")
        if role == "system":
            continue
        blocks = _blocks(message)
        if not blocks:
            continue
        wire_role = "assistant" if role == "assistant" else "user"
        if turns and turns[-1]["role"] == wire_role:
            turns[-1]["content"].extend(blocks)
        else:
            turns.append({"role": wire_role, "content": blocks})
    return ("\n\n".join(s for s in system if s) or None), turns


def _blocks(message: Message) -> list[Block]:
    role = message.get("role")
    if role == "tool":
        content = str(message.get("content") or "")
        block: Block = {
            "type": "tool_result",
            "tool_use_id": str(message["tool_call_id"]),
            "content": content,
        }
        if _is_error(content):
            block["is_error"] = True
        return [block]
    text = message.get("content")
    blocks: list[Block] = [{"type": "text", "text": text}] if text else []
    if role == "assistant":
        for call in message.get("tool_calls") or []:
            blocks.append(
                {
                    "type": "tool_use",
                    "id": str(call["id"]),
                    "name": checked_wire_name(str(call["name"]), PROVIDER),
                    "input": dict(call.get("args") or {}),
                }
            )
    return blocks


def _is_error(content: str) -> bool:
    """A tool outcome that is an error (a refusal, invalid arguments): flagged for the model."""
    try:
        parsed = json.loads(content)
    except ValueError:
        return False
    return isinstance(parsed, dict) and "error" in parsed


def to_tools(tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Our tool schemas as Messages API tools, under their wire names."""
    return [
        {
            "name": checked_wire_name(str(t["name"]), PROVIDER),
            "description": t.get("description") or "",
            "input_schema": t.get("parameters") or {"type": "object", "properties": {}},
        }
        for t in tools
    ]


class AnthropicProvider:
    """Answers each step with one Messages API request to the configured endpoint."""

    name = "anthropic"

    def __init__(self, config: AnthropicSpec, endpoint: ModelProfile) -> None:
        self.config = config
        self.endpoint = endpoint
        self.timeout_s = config.timeout(endpoint, DEFAULT_TIMEOUT_S)
        self._http = sdk_http.sync_client(self.timeout_s)

    def next_step(self, request: StepRequest) -> StepAnswer:
        client = anthropic.Anthropic(
            api_key=self.endpoint.key(),
            base_url=self.endpoint.base_url,
            max_retries=0,  # the engine decides whether to ask again (errors.classify)
            timeout=self.timeout_s,
            http_client=self._http,
        )
        try:
            # The answer is read by the SDK through `sdk_http`, cut off past the bound.
            with (
                http.total_timeout(self.timeout_s),
                bounded.answers_at_most(bounded.answer_limit()),
            ):
                message = client.messages.create(**self.request_body(request))
        except anthropic.APIStatusError as exc:
            raise classify(
                exc.status_code,
                exc.response.headers,
                None,
                body=exc.response.text,
                key_env=self.endpoint.key_source,
                hints=HINTS,
            ) from exc
        except (anthropic.APIConnectionError, httpx2.TransportError) as exc:
            # (An error answer's body is read by the SDK outside its wrapping: httpx2's own.)
            raise _no_response(request.run_id, exc) from exc
        return parse_answer(request.run_id, message.model_dump(mode="json", warnings=False))

    def request_body(self, request: StepRequest) -> dict[str, Any]:
        """The `messages.create` arguments for one step (the run's headers included)."""
        system, messages = to_messages(request.messages)
        body: dict[str, Any] = {
            "model": self.config.model_name(self.endpoint),
            "max_tokens": self.config.max_tokens or self.endpoint.max_tokens or DEFAULT_MAX_TOKENS,
            "messages": messages,
            "extra_headers": request.headers(),
        }
        if system:
            body["system"] = system
        if request.tools:
            body["tools"] = to_tools(request.tools)
        if self.config.temperature is not None:
            # No longer a named argument of the SDK; older models still take it in the body.
            body["extra_body"] = {"temperature": self.config.temperature}
        return body


def _no_response(run_id: str, exc: Exception) -> Exception:
    """No answer came: the send guard's refusal stops the attempt; an answer past the bound
    is not asked again; a timeout or a lost connection is worth asking again; a bad URL is
    not. Only exception types are said: their text may hold the URL with its query."""
    cause: BaseException | None = exc
    while cause is not None:
        if isinstance(cause, SendRefused):
            return cause
        cause = cause.__cause__
    cut = bounded.found_in(exc)
    if cut is not None:
        return too_large(run_id, cut)
    inner = exc.__cause__ if isinstance(exc, anthropic.APIConnectionError) else exc
    if isinstance(inner, httpx2.TransportError | httpx2.InvalidURL):
        return classify(None, None, sdk_http.as_httpx_error(inner))  # its type kept
    if isinstance(exc, anthropic.APITimeoutError):
        return classify(None, None, TimeoutError())
    return classify(None, None, ConnectionError())


def parse_answer(run_id: str, payload: dict[str, Any]) -> StepAnswer:
    """The step's answer from a Messages API response: tool_use blocks, else final text."""
    content = payload.get("content")
    if not isinstance(content, list):
        raise ModelError(f"run {run_id}: the model's response has no content list", retryable=False)
    text = "".join(
        str(b.get("text") or "") for b in content if isinstance(b, dict) and b.get("type") == "text"
    )
    calls = [
        _tool_call(run_id, b)
        for b in content
        if isinstance(b, dict) and b.get("type") == "tool_use"
    ]
    stop = payload.get("stop_reason")
    if calls and stop == "max_tokens":
        raise ModelError(
            f"run {run_id}: the model's answer was cut off at max_tokens while it asked for a "
            "tool call; raise max_tokens in the run's model spec",
            retryable=False,
        )
    if stop == "tool_use" and not calls:
        raise ModelError(
            f"run {run_id}: the model stopped for tool_use without a tool_use block",
            retryable=False,
        )
    return StepAnswer(text=text or None, calls=calls, usage=usage_of(payload))


def usage_of(payload: dict[str, Any]) -> Usage | None:
    """The response's `usage` with the `model` it names, or None when it has none. Anthropic
    counts the input apart from the prompt cache's reads and writes (`input_tokens`,
    `cache_read_input_tokens`, `cache_creation_input_tokens`): all three are input billed, the
    reads the cached part, as OpenAI counts them."""
    usage = payload.get("usage")
    if not isinstance(usage, dict):
        return None
    sent, made = tokens(usage.get("input_tokens")), tokens(usage.get("output_tokens"))
    if sent is None or made is None:
        return None
    read = tokens(usage.get("cache_read_input_tokens")) or 0
    written = tokens(usage.get("cache_creation_input_tokens")) or 0
    return Usage(sent + read + written, made, cached_tokens=read, model=model_of(payload))


def _tool_call(run_id: str, block: dict[str, Any]) -> ToolCall:
    call_id, name, args = block.get("id"), block.get("name"), block.get("input")
    if not isinstance(call_id, str) or not call_id or not isinstance(name, str) or not name:
        raise ModelError(
            f"run {run_id}: the model asked for a tool_use without an id or name", retryable=False
        )
    if not isinstance(args, dict):  # the model is told, as for arguments unlike its schema
        return ToolCall(
            id=call_id,
            name=tool_name(name),
            args={},
            args_error=f"the input is a JSON {type(args).__name__}, not an object",
            raw_args=json.dumps(args),
        )
    return ToolCall(id=call_id, name=tool_name(name), args=args)
