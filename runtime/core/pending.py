"""One call of a step on its way out: the value the call paths (`calls.py`, `waiting.py`) pass."""

from __future__ import annotations

from dataclasses import dataclass

from runtime.durable.state import RunState, ToolCall
from runtime.toolbox.tools import Tool


@dataclass(frozen=True)
class PendingCall:
    """A call of the current step that is to be marked, sent, read back or settled: where it
    sits in its step (`index`), its tool, and the key it is sent with (`stable`: the same key
    on every attempt, I8)."""

    state: RunState
    index: int
    call: ToolCall
    tool: Tool
    key: str
    stable: bool
