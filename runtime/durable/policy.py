"""What a run does when the code a worker runs no longer serves the definition it was started
with (runtime/durable/pins.py, runtime/core/drift.py), and the instructions the code gives an
agent: declared with the agent, so they live apart from the pin's sealing (a tool module
imports them with `agent(...)`, and no database or Celery client with them)."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class Policy(StrEnum):
    """What a run does when the code a worker runs no longer serves its pin."""

    # Keep its definition: wait for a worker that serves it, fail after the stated time.
    PINNED = "pinned"
    # Take the new code's at the next step boundary (re-pinned, audited).
    FOLLOW_LATEST = "follow_latest"


@dataclass(frozen=True)
class Instructions:
    """An agent's instructions as its code declares them: `per_request` when its provider
    sends them with each request (a framework agent), else they are the system prompt a run
    of it starts with (a native agent declared with `agent(..., system=...)`)."""

    text: str
    per_request: bool
