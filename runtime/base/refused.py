"""The error a request refused at the door raises: the caller's input is invalid, nothing was
stored. Its own small module so a reader of runs (the CLI's `status`, the front's reads) can
refuse a malformed id without importing the enqueue path (runtime/core/enqueue.py re-exports
it, with the refusals that path adds)."""

from __future__ import annotations

from store.errors import LiyagentError


class BadRequest(LiyagentError, ValueError):
    """The caller's input is invalid; nothing was stored."""
