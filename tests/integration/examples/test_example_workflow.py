"""The example's refund workflow (examples/order_desk/order_desk/workflows.py), used the way a
team would: loaded by LIYAGENT_TOOLS from outside the engine, started and signalled with the
CLI, approved through the client, its worker SIGKILLed at the refund, the note and the email.
Judged only from the desk's own records: one refund, one note, at most one email."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.cli.test_cli import cli
from tests.integration.examples.test_example_app import example_env, judge
from tests.support.drifts import until
from tests.support.order_desk import Desk, start_desk
from tests.support.scripts import final

ORDER = "A-1001"


@pytest.fixture
def desk(stack, tmp_path: Path) -> Iterator[Desk]:
    desk = start_desk(tmp_path, example_env(stack.env))
    yield desk
    desk.proc.kill()


def flow_env(stack, desk: Desk) -> dict[str, str]:
    return {
        **example_env(stack.env),
        "LIYAGENT_TOOLS": "order_desk.tools,order_desk.workflows",
        "ORDER_DESK_URL": desk.url,
    }


def start_refund(stack, env: dict[str, str]) -> str:
    params = {
        "order_id": ORDER,
        "reason": "arrived broken",
        "follow_up_s": 1,
        "return_wait_s": 600,
        "draft_model": stack.model([final("Dana, your refund is on its way.")]),
    }
    done = cli("workflow", "--name", "order_desk.refund", "--params", json.dumps(params), env=env)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def _waiting_on(stack, run_id: str, prefix: str) -> None:
    until(
        lambda: (stack.client.get(run_id).waiting_on or "").startswith(prefix),
        f"run {run_id} waiting on {prefix}",
        timeout=60,
    )


def approve_and_signal(stack, run_id: str, env: dict[str, str]) -> None:
    """What the people around it do: approve the refund, report the item returned."""
    _waiting_on(stack, run_id, "approval:")
    (pending,) = stack.client.approvals(run_id)
    stack.client.decide(pending.id, approve=True, by="lee")
    _waiting_on(stack, run_id, "signal:return-received:")
    sent = cli("signal", run_id, "return-received", "--payload", '{"box": 1}', "--by", "warehouse",
               env=env)  # fmt: skip
    assert sent.returncode == 0, sent.stderr


def test_the_refund_workflow_runs_to_its_end(stack, desk) -> None:
    env = flow_env(stack, desk)
    stack.worker(env=env)
    stack.beat()
    run_id = start_refund(stack, env)
    approve_and_signal(stack, run_id, env)
    view = stack.wait(run_id, timeout=60)
    assert view.status == "succeeded", view.failure_reason
    answer = json.loads(view.answer)
    assert answer["refunded"] is True and answer["returned"] == {"box": 1}
    assert judge(desk, run_id) == {"refunds": 1, "notes": 1, "emails": 1}
    [email] = desk.rows("SELECT body FROM emails")
    assert email["body"] == "Dana, your refund is on its way."  # the agent step's answer


@pytest.mark.kill
@pytest.mark.parametrize(
    ("fault", "expected"),
    [
        # The refund reached the desk, its answer was lost: sent again with its key, deduped.
        ("after_send:kill:2", {"refunds": 1, "notes": 1, "emails": 1}),
        # The note reached the desk: read back by its key, not sent again.
        ("after_send:kill:3", {"refunds": 1, "notes": 1, "emails": 1}),
        # The email was marked, never sent: settled unknown, never sent.
        ("after_mark:kill:4", {"refunds": 1, "notes": 1, "emails": 0}),
    ],
    ids=["refund-in-doubt", "note-in-doubt", "email-in-doubt"],
)
def test_a_worker_killed_in_the_workflow_writes_nothing_twice(stack, desk, fault, expected) -> None:
    env = flow_env(stack, desk)
    victim = stack.worker("victim", fault=fault, env=env)
    stack.beat()
    run_id = start_refund(stack, env)
    approve_and_signal(stack, run_id, env)
    stack.fault_hit("victim")
    victim.popen.wait(timeout=10)
    stack.worker("survivor", env=env)
    view = stack.wait(run_id, timeout=90)
    assert view.status == "succeeded", view.failure_reason
    assert view.lost_count == 1
    assert judge(desk, run_id) == expected
    # The email in doubt is told to the workflow as unknown (it handles it), never resent.
    told = json.loads(view.answer)["told"]
    assert told == (True if expected["emails"] else "unknown")
