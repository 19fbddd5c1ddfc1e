"""`aclient()`: every public method of `Client` has its async twin, and a run's events can be
awaited as a page or followed with `async for`, against a real worker."""

from __future__ import annotations

import asyncio
import inspect

import pytest

from runtime.entries.aclient import AsyncClient
from runtime.entries.client import Client
from tests.support.scripts import call, final, step


def test_every_client_method_has_an_async_twin() -> None:
    public = {n for n, m in inspect.getmembers(Client, inspect.isfunction) if not n.startswith("_")}
    missing = {n for n in public if not hasattr(AsyncClient, n)}
    assert not missing, f"AsyncClient lacks {sorted(missing)}"
    for name in public - {"events", "follow"}:
        assert inspect.iscoroutinefunction(getattr(AsyncClient, name)), name


@pytest.mark.timeout(120)
def test_async_events_page_and_follow(stack) -> None:
    ac = AsyncClient(stack.client)

    async def scenario() -> tuple[list[str], list[int], str]:
        run_id = await ac.start_run(
            agent="support-bot",
            model=stack.model([step(call("c1", "incident.create", title="x")), final()]),
            user_input="help",
            tools=["incident.create"],
        )
        kinds = [e.kind.value async for e in ac.events(run_id)]
        page = await ac.events(run_id, after=2)
        view = await ac.get(run_id)
        return kinds, [e.seq for e in page.events], view.status

    stack.worker()
    kinds, seqs, status = asyncio.run(scenario())
    assert status == "succeeded"
    assert kinds[0] == "queued" and kinds[-1] == "delivered" and "call_made" in kinds
    assert seqs == list(range(3, len(kinds) + 1))


@pytest.mark.timeout(120)
def test_waits_hold_no_thread_while_they_wait(stack) -> None:
    """Twenty waits on runs no worker takes, with asyncio's thread pool cut to two threads: a
    `get` asked meanwhile is answered before any wait runs out (a wait that held a thread
    while it polled would hold both, and the `get` would queue behind them); then a worker
    comes and every wait returns the run's end."""
    ac = AsyncClient(stack.client)
    model = stack.model([final()])

    async def scenario() -> tuple[list[str], list[str]]:
        from concurrent.futures import ThreadPoolExecutor

        asyncio.get_running_loop().set_default_executor(ThreadPoolExecutor(2))
        order: list[str] = []
        ids = [
            await ac.start_run(agent="support-bot", model=model, user_input="hi") for _ in range(20)
        ]

        async def short_wait(run_id: str) -> None:
            try:
                await ac.wait(run_id, timeout_s=3)
            except TimeoutError:
                order.append("timed out")

        async def get() -> None:
            await asyncio.sleep(0.3)
            await ac.get(ids[0])
            order.append("get")

        await asyncio.gather(*(short_wait(r) for r in ids), get())
        stack.worker()
        views = await asyncio.gather(*(ac.wait(r, timeout_s=60) for r in ids))
        return order, [v.status for v in views]

    order, statuses = asyncio.run(scenario())
    assert order[0] == "get" and order.count("timed out") == 20, order
    assert statuses == ["succeeded"] * 20
