"""The example app (examples/order_desk), used the way a user would: its package outside the
liyagent packages on PYTHONPATH, its tools and agent loaded by `LIYAGENT_TOOLS=order_desk.tools`,
its desk service started locally, the agent started with `liyagent run --agent order-desk`, a
worker SIGKILLed mid-run and a survivor resuming. Judged only from the desk's own records:
nothing lost, no write twice."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from liyagent.local.procs import ROOT
from tests.integration.cli.test_cli import cli
from tests.support.order_desk import (
    ORDER_DESK,
    Desk,
    kill_after_the_first_write,
    start_desk,
    with_path,
)
from tests.support.scripts import call, final, step

EXAMPLE = ORDER_DESK
ORDER = "A-1001"
STEPS = [
    step(call("toolu_lookup", "lookup_order", order_id=ORDER), latency_ms=200),
    step(
        call("toolu_refund", "issue_refund", order_id=ORDER, amount_cents=4599, reason="broken"),
        call("toolu_note", "add_order_note", order_id=ORDER, text="Refunded in full."),
        latency_ms=200,
    ),
    step(
        call("toolu_email", "email_customer", order_id=ORDER, subject="Refund", body="Done."),
        latency_ms=200,
    ),
    final("Refunded A-1001.", latency_ms=200),
]


def example_env(base: dict[str, str]) -> dict[str, str]:
    return with_path(base, EXAMPLE)


@pytest.fixture
def desk(tmp_path: Path) -> Iterator[Desk]:
    desk = start_desk(tmp_path, example_env(dict(os.environ)))
    yield desk
    desk.proc.kill()


def user_env(stack, desk: Desk) -> dict[str, str]:
    """What a user sets: the tool module, the desk's URL and the agent's model."""
    return {
        **example_env(stack.env),
        "LIYAGENT_TOOLS": "order_desk.tools",
        "ORDER_DESK_URL": desk.url,
        "ORDER_DESK_MODEL": json.dumps(stack.model(STEPS)),
    }


def start_agent(env: dict[str, str]) -> str:
    done = cli("run", "--agent", "order-desk", "--input", "My order arrived broken", env=env)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_the_example_loads_only_from_outside_the_engine(stack) -> None:
    plain = subprocess.run(
        [sys.executable, "-c", "import order_desk.tools"],
        cwd=ROOT,
        env=stack.env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert plain.returncode != 0  # the engine does not ship it: only its PYTHONPATH finds it
    found = subprocess.run(
        [sys.executable, "-c", "import order_desk.tools as t; print(t.__file__)"],
        cwd=ROOT,
        env=example_env(stack.env),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert found.stdout.strip() == str(EXAMPLE / "order_desk" / "tools.py"), found.stderr


def test_the_example_agent_runs_on_a_real_worker(stack, desk) -> None:
    env = user_env(stack, desk)
    stack.worker(env=env)
    run_id = start_agent(env)
    view = stack.wait(run_id)
    assert view.status == "succeeded", view
    assert view.answer == "Refunded A-1001."
    verdict = judge(desk, run_id)
    assert verdict == {"refunds": 1, "notes": 1, "emails": 1}
    # Every write carried its step key; the refund's was the one the desk dedupes on.
    [refund] = desk.rows("SELECT idem_key, run_id FROM requests WHERE path = '/refunds'")
    assert refund["idem_key"] and refund["run_id"] == run_id


@pytest.mark.kill
@pytest.mark.parametrize(
    ("fault", "expected"),
    [
        # The refund reached the desk, its answer was lost: sent again with its key, deduped.
        ("after_send:kill", {"refunds": 1, "notes": 1, "emails": 1}),
        # The note reached the desk: read back by its key, reused, not sent again.
        ("after_send:kill:2", {"refunds": 1, "notes": 1, "emails": 1}),
        # The email was marked, never sent: reported unknown to the model, never sent.
        ("after_mark:kill:3", {"refunds": 1, "notes": 1, "emails": 0}),
    ],
    ids=["refund-in-doubt", "note-in-doubt", "email-in-doubt"],
)
def test_a_worker_killed_mid_run_resumes_without_a_write_twice(
    stack, desk, fault, expected
) -> None:
    env = user_env(stack, desk)
    run_id = stack.kill_then_resume(fault, lambda: start_agent(env), env=env)
    view = stack.wait(run_id)
    assert view.status == "succeeded", view
    assert view.lost_count == 1
    assert judge(desk, run_id) == expected
    if fault == "after_send:kill":
        sent = desk.rows("SELECT idem_key, attempt, deduped FROM requests WHERE path = '/refunds'")
        assert [(r["attempt"], r["deduped"]) for r in sent] == [("1", 0), ("2", 1)]
        assert len({r["idem_key"] for r in sent}) == 1


@pytest.mark.kill
def test_a_worker_killed_at_a_random_moment_after_the_first_write(stack, desk) -> None:
    seed = int(os.environ.get("LIYAGENT_KILL_SEED") or random.randrange(2**31))
    delay = random.Random(seed).uniform(0.0, 1.2)
    env = user_env(stack, desk)
    # The random moment (seed in the failure message).
    run_id = kill_after_the_first_write(stack, desk, env, lambda: start_agent(env), delay)
    view = stack.wait(run_id)
    assert view.status == "succeeded", f"seed {seed}: {view}"
    verdict = judge(desk, run_id)
    assert verdict["refunds"] == 1 and verdict["notes"] == 1, f"seed {seed}: {verdict}"
    assert verdict["emails"] <= 1, f"seed {seed}: {verdict}"


def judge(desk: Desk, run_id: str) -> dict[str, int]:
    """From the desk's records: what exists, and that no key made two of anything."""
    for table in ("refunds", "notes", "emails"):
        twice = desk.rows(f"SELECT idem_key FROM {table} GROUP BY idem_key HAVING count(*) > 1")
        assert not twice, f"{table} made twice for keys {[r['idem_key'] for r in twice]}"
    writes = desk.rows("SELECT DISTINCT run_id FROM requests WHERE method = 'POST'")
    assert [r["run_id"] for r in writes] == [run_id]
    return {
        table: desk.rows(f"SELECT count(*) AS n FROM {table}")[0]["n"]
        for table in ("refunds", "notes", "emails")
    }
