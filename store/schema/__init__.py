"""The schema: every table, constraint and index, each named, on one `MetaData`; the tables
by concern (the core's, the entry kinds', what runs spend), all registered on import."""

from __future__ import annotations

from store.schema import core, entries, spend
from store.schema.base import CALL_STATUSES, RUN_STATUSES, metadata
from store.schema.core import runs

__all__ = ["CALL_STATUSES", "RUN_STATUSES", "core", "entries", "metadata", "runs", "spend"]
