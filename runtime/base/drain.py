"""Warm shutdown: a flag the worker's main process raises and every run checks at its steps.

`install()` runs in the worker's main process before the pool forks, so pool children share
the same event; `request()` raises it (Celery's `worker_shutting_down`); a run that sees it
hands itself back at its next step boundary.
"""

from __future__ import annotations

import multiprocessing
import threading
from multiprocessing.synchronize import Event as ProcessEvent

_event: ProcessEvent | threading.Event = threading.Event()


def install() -> None:
    """Share the flag across the worker's processes (call before the pool starts)."""
    global _event
    _event = multiprocessing.get_context("fork").Event()


def request() -> None:
    _event.set()


def requested() -> bool:
    return _event.is_set()


def wait(timeout_s: float) -> bool:
    """Pause up to `timeout_s`, ending early at a warm shutdown; True if one was requested."""
    return bool(_event.wait(timeout_s))


def clear() -> None:
    _event.clear()
