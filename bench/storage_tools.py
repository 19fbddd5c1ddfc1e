"""The storage section's tool module: a read whose result is as large as asked, and which tells
the bench when it runs (after its step's record was written, before the next step is asked),
so the bench can read Postgres's WAL position between two steps.

Loaded in the bench's own process (the storage section drives the engine in-process).
"""

from __future__ import annotations

import secrets
from collections.abc import Callable
from typing import Any

from liyagent import CallContext, tool

# Called with the step whose call is being made; set by bench/storage.py for its measured run.
observer: Callable[[int], None] | None = None


@tool.read(name="bench.blob")
def blob(ctx: CallContext, size: int) -> dict[str, Any]:
    """Return `size` characters of fresh random hex (no two results alike, nothing for a
    compressor to find), after telling the observer which step asked."""
    if observer is not None:
        observer(ctx.step)
    return {"text": secrets.token_hex(size // 2 + 1)[:size]}
