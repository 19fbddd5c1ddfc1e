"""The interface every model provider implements: answer exactly one step."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from runtime.durable.state import Message, ToolCall
from store.errors import LiyagentError


@dataclass(frozen=True)
class StepRequest:
    """Ask for model step `step` (1-based) of a run, given the conversation so far."""

    run_id: str
    attempt: int
    step: int
    messages: list[Message]
    tools: list[dict[str, Any]]
    # The agent's instructions as its run pinned them (runtime/durable/pins.py), which a
    # framework agent's provider sends with the request; None: the run pinned none.
    instructions: str | None = None

    def headers(self) -> dict[str, str]:
        """Who asks, for the model server's own records (never a secret): the run, its
        attempt and the step asked for."""
        return {
            "X-Liyagent-Run": self.run_id,
            "X-Liyagent-Attempt": str(self.attempt),
            "X-Liyagent-Step": str(self.step),
        }

    def latest_tool_results(self) -> list[Message]:
        """The tool messages after the model's last step: what it is told now."""
        out: list[Message] = []
        for message in reversed(self.messages):
            if message.get("role") != "tool":
                break
            out.append(message)
        return out[::-1]


@dataclass(frozen=True)
class Typed:
    """A final answer's value, checked against the output type its agent declares (JSON-able:
    it is sealed with the answer and read back as `RunView.output`)."""

    value: Any


@dataclass(frozen=True)
class Usage:
    """A model request's tokens, as its response's usage counts them: every input token it
    was billed for (`cached_tokens` of them read from the provider's prompt cache), the
    tokens it generated, and the model the response says answered (None: it does not say)."""

    input_tokens: int
    output_tokens: int
    cached_tokens: int = 0
    model: str | None = None


@dataclass(frozen=True)
class StepAnswer:
    """Either tool calls to make, or a final text (with its typed value when the agent declares
    an output type), or a final answer refused because it does not fit that type."""

    text: str | None
    calls: list[ToolCall]
    output: Typed | None = None
    # Why the model's final answer was refused (it does not fit the declared output type): the
    # step is written with the model told why (`RunState.take_refused`) and the next step is
    # asked, within the step limit. `calls` are then the calls the answer itself was made of
    # (an output tool's), told the refusal, never made.
    refused: str | None = None
    # The tokens the provider says the request used (its response's usage), when it says:
    # what settles the endpoint's token limits (runtime/flow/limits.py), and what is written
    # with the step (store/usage.py).
    usage: Usage | None = None

    @property
    def final(self) -> bool:
        return not self.calls and self.refused is None


class ModelError(LiyagentError):
    """A provider failed; `retryable` says whether asking again may help, `rate_limited`
    that the endpoint answered 429 (it closes the endpoint for the fleet: runtime/flow/)."""

    def __init__(
        self,
        message: str,
        *,
        retryable: bool,
        retry_after_s: float | None = None,
        rate_limited: bool = False,
    ) -> None:
        super().__init__(message)
        self.retryable = retryable
        self.retry_after_s = retry_after_s
        self.rate_limited = rate_limited


class ModelProvider(Protocol):
    name: str

    def next_step(self, request: StepRequest) -> StepAnswer: ...
