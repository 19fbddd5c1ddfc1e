"""Running a coroutine to its end from synchronous code, whether or not the calling thread
already runs an event loop.

Tools, framework agents and MCP servers are async in places (an async tool body, Pydantic AI's
toolsets and model requests, the Agents SDK's invoker, the MCP client), while the engine calls
them from plain threads: a worker's pool slot (prefork, threads, solo) or an app's code loading
its tool modules. An app built on asyncio (a FastAPI handler calling `liyagent.client()`)
loads them from inside its running loop, where `asyncio.run` and `asyncio.Runner.run` refuse
to start a second loop ("Cannot run the event loop while another loop is running"). So the
coroutine then runs on a helper thread with a loop of its own, the calling thread waiting for
its end: the app's loop is held only as long as a synchronous call would hold it anyway.

Two shapes:

- `run_coroutine`: at call time, on a loop kept per thread between calls (pooled async
  connections, an SDK client's among them, are bound to the loop that opened them); a thread
  inside a running loop always gets the same helper thread, so the same kept loop.
- `run_once`: at load time, on a fresh loop closed after. A module is loaded before a prefork
  pool forks, and a child must not inherit its parent's loop (their selector is shared).
"""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Awaitable, Callable, Coroutine
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from runtime.base import process

T = TypeVar("T")

# Per thread: its kept runner, and (a thread that runs a loop) its helper thread; a forked child
# forgets them (their selector and thread are the parent's: runtime/base/process.py).
_here = process.ThreadLocal("runtime.toolbox.coroutines", "_here")


def in_running_loop() -> bool:
    """Whether the calling thread is inside a running event loop (an asyncio app's code)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


def run_coroutine(awaitable: Awaitable[T]) -> T:
    """Run `awaitable` to its end on this thread's kept event loop, in a copy of the current
    context (so the send guard, the call's transport and its key hold); from inside a running
    loop, on this thread's helper thread's kept loop, this thread waiting for it."""
    context = contextvars.copy_context()
    if not in_running_loop():
        return _on_kept_loop(awaitable, context)
    helper: ThreadPoolExecutor | None = getattr(_here, "helper", None)
    if helper is None:
        helper = _here.helper = ThreadPoolExecutor(1, thread_name_prefix="liyagent-coroutines")
    return helper.submit(_on_kept_loop, awaitable, context).result()


def _on_kept_loop(awaitable: Awaitable[T], context: contextvars.Context) -> T:
    runner: asyncio.Runner | None = getattr(_here, "runner", None)
    if runner is None:
        runner = _here.runner = asyncio.Runner()

    async def wrapped() -> T:
        return await awaitable

    return runner.run(wrapped(), context=context)


def run_once(make: Callable[[], Coroutine[Any, Any, T]]) -> T:
    """Run the coroutine `make()` gives to its end on a fresh event loop, closed after; on a
    thread of its own when this thread already runs a loop (see the module's docstring)."""
    if not in_running_loop():
        return asyncio.run(make())
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="liyagent-load") as pool:
        return pool.submit(lambda: asyncio.run(make())).result()


__all__ = ["in_running_loop", "run_coroutine", "run_once"]
