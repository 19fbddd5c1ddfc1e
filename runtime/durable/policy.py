"""What a run does when the code a worker runs no longer serves the definition it was started
with (runtime/durable/pins.py, runtime/core/drift.py): declared per agent, so it lives apart
from the pin's sealing (a tool module imports it with `agent(...)`)."""

from __future__ import annotations

from enum import StrEnum


class Policy(StrEnum):
    """What a run does when the code a worker runs no longer serves its pin."""

    # Keep its definition: wait for a worker that serves it, fail after the stated time.
    PINNED = "pinned"
    # Take the new code's at the next step boundary (re-pinned, audited).
    FOLLOW_LATEST = "follow_latest"
