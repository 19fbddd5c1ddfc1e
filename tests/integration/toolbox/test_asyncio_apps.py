"""A team's asyncio web app (tests/support/asgi_app.py, Starlette served by uvicorn in its own
process, as a FastAPI app is) whose handlers make `liyagent.client()` and `liyagent.aclient()`
lazily inside the running loop, with a Pydantic AI agent and an OpenAI Agents SDK agent
registered in the modules it loads then (the Pydantic AI adapter lists its tools at load). Each
handler starts a run of one agent and sees it finish on a real worker, under every pool a
worker may run (prefork, threads, solo), each write made once (the desk's own records), and
reads its answer as the agent's own output type (the app declares the agents)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from liyagent.local.procs import Proc, python
from tests.support import framework_apps as apps
from tests.support.framework_apps import ANSWER
from tests.support.order_desk import Desk


@pytest.fixture
def desk(tmp_path: Path) -> Iterator[Desk]:
    yield from apps.PYDANTIC_DESK.desk(tmp_path)


def _start_app(stack, env: dict[str, str]) -> str:
    app = Proc(
        "app", python("-m", "tests.support.asgi_app", "--port", "0"), env, stack.tmp / "app.log"
    )
    stack.procs.append(app)
    return app.wait_for(r"app listening on (\S+)", timeout=60).group(1)


@pytest.mark.parametrize("pool", ["prefork", "threads", "solo"])
def test_an_asyncio_app_starts_framework_agents_runs_from_its_handlers(stack, desk, pool) -> None:
    env = apps.both_desks_env(stack, desk)
    stack.worker(env=env, pool=pool)
    url = _start_app(stack, env)
    ran = {}
    for route, agent in [("client", "pydantic-desk"), ("aclient", "agents-desk")]:
        answered = httpx.post(
            f"{url}/{route}", json={"agent": agent, "input": "A-1001 arrived broken"}, timeout=150
        )
        log = (stack.tmp / "app.log").read_text()[-3000:]
        assert answered.status_code == 200, f"{route} ({agent}): {answered.text}\n{log}"
        ran[agent] = answered.json()
        assert ran[agent]["status"] == "succeeded", ran[agent]
        assert ran[agent]["output"] == ANSWER
        # The app declares the agent: it reads the answer as the agent's own output type.
        package = agent.replace("-", "_")
        assert ran[agent]["type"] == f"{package}.agent.DeskAnswer"
        assert ran[agent]["order_id"] == ANSWER["order_id"]
        assert set(stack.asked(ran[agent]["run_id"]).values()) == {1}  # no step asked twice
    assert apps.judge(desk) == {"refunds": 2, "emails": 2}
    refunds = desk.rows("SELECT run_id FROM requests WHERE path = '/refunds'")
    assert sorted(r["run_id"] for r in refunds) == sorted(r["run_id"] for r in ran.values())
