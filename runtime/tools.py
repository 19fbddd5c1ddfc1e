"""Tools declare what they are, so the engine knows how to make and settle each call."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any


class ToolKind(StrEnum):
    READ = "read"  # harmless to make again; never marked
    WRITE = "write"  # changes something; settled by its reader, else reported unknown
    KEYED_WRITE = "keyed_write"  # its vendor dedupes on the step key for `dedupe_window_s`
    APPROVAL_WRITE = "approval_write"  # held until a person approves; sent with the approval id
    DELEGATION = "delegation"  # a sub-agent run, created and found again by its delegation key
    REMOTE_AGENT = "remote_agent"  # another agent over A2A; settled by reading its task back

    @property
    def changes(self) -> bool:
        return self is not ToolKind.READ


@dataclass(frozen=True)
class CallContext:
    """What a tool needs to make one call: who makes it and with which idempotency key."""

    run_id: str
    attempt: int
    step: int
    call_id: str
    key: str
    timeout_s: float


class ToolError(Exception):
    """The vendor answered with a definite refusal: the call's outcome is this error."""


class ToolInDoubt(Exception):
    """The call may or may not have reached its vendor (timeout, reset, 5xx)."""


Invoke = Callable[[dict[str, Any], CallContext], dict[str, Any]]
# A reader returns the call's outcome found by its key, or None when the write never landed.
Reader = Callable[[dict[str, Any], CallContext], dict[str, Any] | None]


@dataclass(frozen=True)
class Tool:
    name: str
    kind: ToolKind
    description: str
    invoke: Invoke
    reader: Reader | None = None
    dedupe_window_s: float | None = None
    parameters: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        if self.kind is ToolKind.KEYED_WRITE and not self.dedupe_window_s:
            raise ValueError(f"tool {self.name}: a keyed write must declare its dedupe window")

    def schema(self) -> dict[str, Any]:
        """The tool as a model sees it."""
        return {
            "name": self.name,
            "description": self.description,
            "parameters": self.parameters or {"type": "object"},
        }


class ToolRegistry:
    """Tools by name; one registry per process."""

    def __init__(self, tools: list[Tool] | None = None) -> None:
        self._tools: dict[str, Tool] = {}
        for tool in tools or []:
            self.register(tool)

    def register(self, tool: Tool) -> None:
        if tool.name in self._tools:
            raise ValueError(f"tool {tool.name} is registered twice")
        self._tools[tool.name] = tool

    def get(self, name: str) -> Tool | None:
        return self._tools.get(name)

    def names(self) -> list[str]:
        return sorted(self._tools)

    def schemas(self, allowed: list[str] | None = None) -> list[dict[str, Any]]:
        names = self.names() if allowed is None else [n for n in allowed if n in self._tools]
        return [self._tools[n].schema() for n in names]
