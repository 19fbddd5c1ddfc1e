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
