"""Operators watch workers in Flower: task events are off until Flower runs, which turns them
on for every worker, so the runs it sees are the ones made while it watches."""

from __future__ import annotations

import time

import httpx

from liyagent.local.cluster import FLOWER_READY, flower_command
from liyagent.local.procs import Proc
from tasks.services import RUN_TASK
from tests.support.scripts import mixed

USER, PASSWORD = "ops", "flower-test-password"


def _flower(stack) -> str:
    argv, env = flower_command(stack.env, USER, PASSWORD)
    proc = Proc("flower", argv, env, stack.tmp / "flower.log")
    stack.procs.append(proc)
    return proc.wait_for(FLOWER_READY, timeout=60).group(1).rstrip("/")


def _runs_seen(url: str) -> dict[str, str]:
    """Run ids Flower lists as liyagent.run tasks, with their state."""
    answer = httpx.get(f"{url}/api/tasks", auth=(USER, PASSWORD), timeout=10)
    answer.raise_for_status()
    return {
        str(t["args"]).split("'")[1]: t["state"]
        for t in answer.json().values()
        if t.get("name") == RUN_TASK and "'" in str(t.get("args"))
    }


def test_flower_turns_task_events_on_and_sees_the_runs(stack) -> None:
    w1 = stack.worker("w1")
    url = _flower(stack)
    deadline = time.monotonic() + 60
    # Flower asks every worker to send task events as soon as it starts, then every 5 s.
    while "Events of group {task} enabled by remote" not in w1.output():
        assert time.monotonic() < deadline, w1.output()[-2000:]
        time.sleep(0.1)
    run_id = stack.start(mixed("f"))
    assert stack.wait(run_id, timeout=60).status == "succeeded"
    while _runs_seen(url).get(run_id) != "SUCCESS":
        assert time.monotonic() < deadline, _runs_seen(url)
        time.sleep(0.2)
