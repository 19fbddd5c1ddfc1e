"""A user's tool module with a read whose result is as large as asked: the storage tests'
10 KB tool results. Loaded with LIYAGENT_TOOLS (or a test's own services)."""

from __future__ import annotations

import hashlib
from typing import Any

from liyagent import CallContext, tool


@tool.read(name="bulk.read")
def bulk_read(ctx: CallContext, size: int, seed: str = "") -> dict[str, Any]:
    """Return `size` characters of text that differ per seed (hex digests, so no two steps'
    results are alike)."""
    chunk = hashlib.sha256(f"{seed}|{ctx.step}".encode()).hexdigest()
    return {"text": (chunk * (size // len(chunk) + 1))[:size]}
