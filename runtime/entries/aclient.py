"""The client API for asyncio apps (FastAPI and the like): every public method of `Client`,
as a coroutine running the very same code in a worker thread (no second copy of the logic),
and `events(run_id)`, which is both awaitable (a page, as `Client.events`) and an async
iterator following the run until it ends (its waits hold no thread and no connection)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable, Coroutine, Generator
from typing import Any, Concatenate, ParamSpec, TypeVar

from runtime.entries.client import Client, parse_after, parse_id
from runtime.ops.events import RECHECK_S, EventPage, RunEvent, follow_async
from runtime.ops.run_view import RunView, still_waiting
from store.states import FINISHED

P = ParamSpec("P")
R = TypeVar("R")


def _twin(
    method: Callable[Concatenate[Client, P], R],
) -> Callable[Concatenate[AsyncClient, P], Coroutine[Any, Any, R]]:
    """`Client.method` as a coroutine of the async client: the sync code, in a thread."""

    async def run(self: AsyncClient, /, *args: P.args, **kwargs: P.kwargs) -> R:
        return await asyncio.to_thread(method, self.sync, *args, **kwargs)

    run.__name__, run.__qualname__ = method.__name__, f"AsyncClient.{method.__name__}"
    run.__doc__ = method.__doc__
    return run


class Events:
    """`await` it for one page after `after`; `async for` it to follow the run to its end."""

    def __init__(self, client: AsyncClient, run_id: str, after: int, recheck_s: float) -> None:
        self.client, self.run_id, self.after, self.recheck_s = client, run_id, after, recheck_s

    def __await__(self) -> Generator[Any, None, EventPage]:
        return asyncio.to_thread(self.client.sync.events, self.run_id, self.after).__await__()

    def __aiter__(self) -> AsyncIterator[RunEvent]:
        s = self.client.sync.s
        run_id, after = parse_id(self.run_id), parse_after(self.after)
        return follow_async(s.engine, s.changes, run_id, after, self.recheck_s)


class AsyncClient:
    """`Client`'s methods as coroutines (see the module's docstring)."""

    def __init__(self, sync: Client) -> None:
        self.sync = sync

    start_run = _twin(Client.start_run)
    start_agent = _twin(Client.start_agent)
    declared_agent = _twin(Client.declared_agent)
    start_workflow = _twin(Client.start_workflow)
    signal = _twin(Client.signal)
    publish_event = _twin(Client.publish_event)
    start_job = _twin(Client.start_job)
    resolve_run_id = _twin(Client.resolve_run_id)
    get = _twin(Client.get)
    transcript = _twin(Client.transcript)
    stop = _twin(Client.stop)
    stop_run = _twin(Client.stop_run)
    stop_agent = _twin(Client.stop_agent)
    erase = _twin(Client.erase)
    known_agent = _twin(Client.known_agent)
    lift_stop = _twin(Client.lift_stop)
    approvals = _twin(Client.approvals)
    decide = _twin(Client.decide)
    raise_budget = _twin(Client.raise_budget)
    set_budget = _twin(Client.set_budget)

    async def wait(
        self,
        run_id: str,
        timeout_s: float = 60.0,
        poll_s: float = 0.1,
        until: frozenset[str] = FINISHED,
    ) -> RunView:
        """`Client.wait` holding no thread while it waits: the run is read again (a thread
        for that one read) when its nudge comes, or after `poll_s`; TimeoutError with its
        state after `timeout_s`. Many waits at once do not fill asyncio's thread pool."""
        deadline = time.monotonic() + timeout_s
        view = await asyncio.to_thread(self.sync.get, run_id)
        with self.sync.s.changes.watch(view.id) as watch:
            while True:
                if view.status in until:
                    return view
                if time.monotonic() > deadline:
                    raise still_waiting(run_id, view, timeout_s)
                await watch.wait_async(min(poll_s, max(0.0, deadline - time.monotonic())))
                watch.clear()
                view = await asyncio.to_thread(self.sync.get, run_id)

    def events(self, run_id: str, after: int = 0, recheck_s: float = RECHECK_S) -> Events:
        """The run's events after `after`: awaited, a page; iterated, followed to its end."""
        return Events(self, run_id, after, recheck_s)

    def follow(
        self, run_id: str, after: int = 0, recheck_s: float = RECHECK_S
    ) -> AsyncIterator[RunEvent]:
        """Every event after `after` as it is recorded, until the run ends."""
        return aiter(self.events(run_id, after, recheck_s))
