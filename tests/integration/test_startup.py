"""A process that would fail every task refuses to start, saying what to fix; and a message
that could not be handled at all goes back to its queue instead of being acked and dropped."""

from __future__ import annotations

import signal
import subprocess
import sys

import pytest
import redis

from liyagent.local.procs import ROOT
from liyagent.local.servers import free_port

SEAL_MESSAGE = "LIYAGENT_SEAL_KEYS is not set and LIYAGENT_ENV=production"


def _run(argv: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", *argv], env=env, cwd=ROOT, capture_output=True, text=True, timeout=60
    )


def _env(stack, **changes: str) -> dict[str, str]:
    env = {**stack.env, **changes}
    return {k: v for k, v in env.items() if v != ""}


@pytest.mark.parametrize(
    "argv",
    [["celery", "-A", "tasks", "worker", "-c", "1"], ["celery", "-A", "tasks", "beat"]],
    ids=["worker", "beat"],
)
def test_production_without_seal_keys_refuses_to_start(stack, argv) -> None:
    done = _run(argv, _env(stack, LIYAGENT_ENV="production", LIYAGENT_SEAL_KEYS=""))
    assert done.returncode == 2
    assert SEAL_MESSAGE in done.stderr and "liyagent keys new" in done.stderr
    cli = _run(
        ["liyagent", "status"], _env(stack, LIYAGENT_ENV="production", LIYAGENT_SEAL_KEYS="")
    )
    assert cli.returncode == 2 and SEAL_MESSAGE in cli.stderr  # the same message as the CLI


@pytest.mark.parametrize(
    ("tools", "says"),
    [
        ("lyt_no_such_module", "module lyt_no_such_module failed to import"),
        ("json", "module json declares no tools or agents"),
    ],
)
def test_a_tool_module_that_does_not_load_stops_the_worker(stack, tools, says) -> None:
    done = _run(["celery", "-A", "tasks", "worker", "-c", "1"], _env(stack, LIYAGENT_TOOLS=tools))
    assert done.returncode == 2 and says in done.stderr
    assert "Traceback" not in done.stderr


def test_a_message_that_cannot_be_handled_goes_back_to_its_queue(stack) -> None:
    dead_db = f"postgresql+psycopg://postgres@127.0.0.1:{free_port()}/nowhere"
    worker = stack.worker("w1", env={"LIYAGENT_DATABASE_URL": dead_db}, ops=False)
    run_id = stack.start([{"final": "Done."}])
    worker.wait_for(r"message\.requeued", timeout=30)
    worker.popen.send_signal(signal.SIGTERM)  # warm shutdown: the task ends, then the worker
    worker.popen.wait(timeout=30)
    client = redis.Redis.from_url(stack.settings.redis_url)
    assert client.llen(f"{stack.settings.namespace}{stack.settings.queue}") == 1
    client.close()
    assert stack.client.get(run_id).status == "queued"
    stack.worker("w2")
    assert stack.wait(run_id).status == "succeeded"
