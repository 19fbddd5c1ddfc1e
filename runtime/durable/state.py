"""The run state a checkpoint seals: conversation, the calls asked, counters, history, keys.

The whole state is sealed once, at enqueue (the run's base); each step after seals only what
it added (`delta`), and a resume rebuilds the state by applying the step records in order
(`apply`, runtime/durable/chain.py). The conversation and history only ever grow at their end.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from runtime.durable import formats

Message = dict[str, Any]


@dataclass(frozen=True)
class ToolCall:
    """One call a model step asked for, with the provider's own id."""

    id: str
    name: str
    args: dict[str, Any]
    # Why the model's arguments could not be read (not JSON, not an object): the call is not
    # made and the model is told, as for arguments that fail their schema. `raw_args` is what
    # the model sent, given back to it as it was.
    args_error: str | None = None
    raw_args: str | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"id": self.id, "name": self.name, "args": self.args}
        if self.args_error is not None:
            out["args_error"] = self.args_error
            out["raw_args"] = self.raw_args
        return out

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> ToolCall:
        error, text = raw.get("args_error"), raw.get("raw_args")
        return cls(
            id=str(raw["id"]),
            name=str(raw["name"]),
            args=dict(raw.get("args") or {}),
            args_error=None if error is None else str(error),
            raw_args=None if text is None else str(text),
        )


@dataclass(frozen=True)
class Written:
    """What the last sealed record (base or step) held, so the next holds only what is new."""

    digest: bytes
    messages: int
    history: int
    counters: dict[str, int]
    delegation_keys: dict[str, str]
    cursor: str


def _canonical(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), sort_keys=True)


@dataclass
class RunState:
    """What a resume needs to continue from the last written step (and nothing else)."""

    step: int
    loop: str
    messages: list[Message]
    calls: list[ToolCall] = field(default_factory=list)
    counters: dict[str, int] = field(default_factory=dict)
    history: list[dict[str, Any]] = field(default_factory=list)
    delegation_keys: dict[str, str] = field(default_factory=dict)
    # Where a workflow stands: the step to execute next and how often each loop went back.
    cursor: dict[str, Any] = field(default_factory=dict)
    # The last record written (None until the state is loaded from its records).
    written: Written | None = field(default=None, compare=False, repr=False)

    def to_payload(self) -> dict[str, Any]:
        return {
            "v": formats.CHECKPOINT.writes,
            "step": self.step,
            "loop": self.loop,
            "messages": self.messages,
            "calls": [c.to_json() for c in self.calls],
            "counters": self.counters,
            "history": self.history,
            "delegation_keys": self.delegation_keys,
            "cursor": self.cursor,
        }

    @classmethod
    def from_payload(cls, raw: dict[str, Any], run_id: str = "") -> RunState:
        """The state a base checkpoint holds; NewerFormat when newer code wrote it."""
        formats.CHECKPOINT.check(run_id, raw.get("v"))
        return cls(
            step=int(raw["step"]),
            loop=str(raw["loop"]),
            messages=list(raw["messages"]),
            calls=[ToolCall.from_json(c) for c in raw.get("calls", [])],
            counters=dict(raw.get("counters", {})),
            history=list(raw.get("history", [])),
            delegation_keys=dict(raw.get("delegation_keys", {})),
            cursor=dict(raw.get("cursor", {})),
        )

    def mark_written(self, digest: bytes) -> None:
        """The state as it stands is now sealed in the record whose digest is `digest`."""
        self.written = Written(
            digest=digest,
            messages=len(self.messages),
            history=len(self.history),
            counters=dict(self.counters),
            delegation_keys=dict(self.delegation_keys),
            cursor=_canonical(self.cursor),
        )

    def delta(self) -> dict[str, Any]:
        """What the state gained since the last record: the messages that arrived (tool results,
        the model's answer), the calls asked now, the history entries, the counters and
        delegation keys that changed, the cursor if it moved."""
        w = self.written
        if w is None:
            raise ValueError("the state was not loaded from its records: no delta to take")
        out: dict[str, Any] = {
            "v": formats.STEP_RECORD.writes,
            "step": self.step,
            "messages": self.messages[w.messages :],
            "calls": [c.to_json() for c in self.calls],
            "history": self.history[w.history :],
            "counters": {k: v for k, v in self.counters.items() if w.counters.get(k) != v},
            "delegation_keys": {
                k: v for k, v in self.delegation_keys.items() if w.delegation_keys.get(k) != v
            },
        }
        if _canonical(self.cursor) != w.cursor:
            out["cursor"] = self.cursor
        return out

    def apply(self, delta: dict[str, Any], run_id: str = "") -> None:
        """Add one step record's delta, as `delta` took it; NewerFormat when newer code wrote
        it."""
        formats.STEP_RECORD.check(run_id, delta.get("v"))
        self.step = int(delta["step"])
        self.messages.extend(delta["messages"])
        self.calls = [ToolCall.from_json(c) for c in delta["calls"]]
        self.history.extend(delta["history"])
        self.counters.update(delta["counters"])
        self.delegation_keys.update(delta["delegation_keys"])
        if "cursor" in delta:
            self.cursor = dict(delta["cursor"])

    def asked_bytes(self) -> int:
        """The size of what the current step asked: the model's answer with its calls (or, for
        a workflow or job step, its calls), as sealed."""
        last = self.messages[-1] if self.messages else None
        if last is not None and last.get("role") == "assistant":
            return len(_canonical(last).encode())
        return len(_canonical([c.to_json() for c in self.calls]).encode())

    @classmethod
    def initial(cls, loop: str, system: str | None, user_input: str) -> RunState:
        messages: list[Message] = []
        if system:
            messages.append({"role": "system", "content": system})
        messages.append({"role": "user", "content": user_input})
        return cls(step=0, loop=loop, messages=messages, counters={"model_steps": 0})

    def count_of(self, name: str) -> int:
        return self.counters.get(name, 0)

    def count(self, name: str, n: int = 1) -> None:
        self.counters[name] = self.counters.get(name, 0) + n

    def take_step(self, text: str | None, calls: list[ToolCall], attempt: int) -> None:
        """Append a model step that asked for calls; the caller then checkpoints it."""
        self.step += 1
        self.count("model_steps")
        self.calls = calls
        self.messages.append(
            {"role": "assistant", "content": text, "tool_calls": [c.to_json() for c in calls]}
        )
        self.history.append({"step": self.step, "attempt": attempt, "calls": [c.id for c in calls]})

    def take_refused(
        self, text: str | None, calls: list[ToolCall], reason: str, attempt: int
    ) -> None:
        """Append a model step whose final answer was refused (it does not fit the agent's
        output type) and what the model is told: a tool message per call the answer was made
        of (an output tool's), else a user message; both marked `retry`. Nothing is made; the
        caller checkpoints the step, so it is never asked again (I5)."""
        self.step += 1
        self.count("model_steps")
        self.count("refused_answers")
        self.calls = []
        self.messages.append(
            {"role": "assistant", "content": text, "tool_calls": [c.to_json() for c in calls]}
        )
        told = {"error": reason, "hint": "answer again, with a final answer that fits its type"}
        for c in calls:
            self.messages.append(
                {
                    "role": "tool",
                    "tool_call_id": c.id,
                    "name": c.name,
                    "content": _canonical(told),
                    "retry": True,
                }
            )
        if not calls:
            self.messages.append({"role": "user", "content": reason, "retry": True})
        self.history.append({"step": self.step, "attempt": attempt, "calls": [], "refused": True})

    def add_results(self, results: list[Message]) -> None:
        """Tool results of the current step, appended before the next model step is asked."""
        self.messages.extend(results)
        self.calls = []
