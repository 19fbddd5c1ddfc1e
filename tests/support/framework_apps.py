"""A framework's example app (examples/agents_desk, examples/pydantic_desk): a team's own agent
over the order desk, brought to liyagent by one module of kind declarations and started by name,
run on real workers. The flows its tests share: a run through, a worker SIGKILLed with a write
in flight or at a random moment (the desk's records show no duplicate, the model server's no
step asked again, the answer is the right one), a wrong kinds mapping stopping the worker at
start, a run refused at the door and an approval-held refund."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from liyagent import BadRequest
from liyagent.local.procs import ROOT
from tests.support.ledger import uncovered
from tests.support.order_desk import (
    ORDER_DESK,
    Desk,
    kill_after_the_first_write,
    start_desk,
    with_path,
)
from tests.support.scripts import call, final, step
from tests.support.stack import Stack

ORDER = "A-1001"
ANSWER = {"order_id": ORDER, "refunded_cents": 4599, "summary": "Refunded in full."}
# The model's steps before its answer: a lookup, the refund and the email.
TOOL_STEPS = [
    step(call("call_lookup", "lookup_order", order_id=ORDER), latency_ms=200),
    step(
        call("call_refund", "issue_refund", order_id=ORDER, amount_cents=4599, reason="broken"),
        latency_ms=200,
    ),
    step(
        call("call_email", "email_customer", order_id=ORDER, subject="Refund", body="Done."),
        latency_ms=200,
    ),
]

# The faults that kill a worker with a write in flight, and what the desk holds after.
WRITES_IN_FLIGHT = [
    # The refund reached the desk, its answer was lost: sent again with its key, deduped.
    pytest.param("after_send:kill", {"refunds": 1, "emails": 1}, id="refund-in-flight"),
    # The email was marked, never sent: reported unknown to the model, never sent.
    pytest.param("after_mark:kill:2", {"refunds": 1, "emails": 0}, id="email-in-doubt"),
]

# A kinds mapping with a typo, and what the worker says when it refuses to start.
WRONG_KINDS = [
    pytest.param(
        '{"lookup_ordr": "read"}',
        "kinds names tools the agent does not have: lookup_ordr",
        id="unknown-tool",
    ),
    pytest.param(
        '{"issue_refund": "keyed_wirte:60"}',
        "issue_refund: unknown kind 'keyed_wirte:60'",
        id="kind-typo",
    ),
]


@dataclass(frozen=True)
class FrameworkApp:
    """What differs between the framework examples: the package (`agents_desk`, which reads
    its model from `AGENTS_DESK_MODEL` and `AGENTS_DESK_BASE_URL`), the agent's registered
    name, the framework as liyagent names it, its adapter module and the model's script."""

    package: str
    agent: str
    framework: str
    adapter: str
    steps: list[dict[str, Any]]

    @property
    def example(self) -> Path:
        return ROOT / "examples" / self.package

    def env(self, base: dict[str, str]) -> dict[str, str]:
        """`base` with the example and the order desk it drives on its PYTHONPATH."""
        return with_path(base, self.example, ORDER_DESK)

    def desk(self, tmp: Path) -> Iterator[Desk]:
        """The order desk, for the test's `desk` fixture."""
        desk = start_desk(tmp, self.env(dict(os.environ)))
        yield desk
        desk.proc.kill()

    def user_env(self, stack: Stack, desk: Desk) -> dict[str, str]:
        """What the team sets: the module of kind declarations, the desk and the model endpoint
        (the agent's own OpenAI client reads them)."""
        spec = stack.model(self.steps)
        prefix = self.package.upper()
        return {
            **self.env(stack.env),
            "LIYAGENT_TOOLS": f"{self.package}.durable_desk",
            "ORDER_DESK_URL": desk.url,
            f"{prefix}_MODEL": spec["model"],
            # The simulators' OpenAI-compatible endpoint, which the spec names by profile.
            f"{prefix}_BASE_URL": f"{stack.sim_url}/v1",
            "OPENAI_API_KEY": "sim-model-key",
        }

    def start(self, env: dict[str, str]) -> str:
        """The one line that starts it, in the team's app process."""
        code = (
            f"import liyagent; print(liyagent.start_agent({self.agent!r}, 'A-1001 arrived broken'))"
        )
        done = subprocess.run(
            [sys.executable, "-c", code],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0, done.stderr
        return done.stdout.strip().splitlines()[-1]

    def declarations(self, kinds: str) -> str:
        """A team's module declaring the example's agent with `kinds` (Python source)."""
        return (
            f"from liyagent.adapters.{self.adapter} import durable\n"
            f"from {self.package}.agent import agent\n\n"
            f"desk = durable(agent, kinds={kinds})\n"
        )

    def with_declarations(
        self, stack: Stack, desk: Desk, home: Path, name: str, kinds: str
    ) -> dict[str, str]:
        """`user_env` naming instead a module `name`, written in `home`, that declares `kinds`."""
        home.mkdir()
        (home / f"{name}.py").write_text(self.declarations(kinds))
        env = self.user_env(stack, desk)
        env.update(LIYAGENT_TOOLS=name, PYTHONPATH=f"{home}{os.pathsep}{env['PYTHONPATH']}")
        return env


PYDANTIC_DESK = FrameworkApp(
    package="pydantic_desk",
    agent="pydantic-desk",
    framework="pydantic-ai",
    adapter="pydantic_ai",
    steps=[
        *TOOL_STEPS,
        # A final answer that does not fit its type: the model is told, then answers again.
        step(
            call("call_out1", "final_result", order_id=ORDER, refunded_cents="all"), latency_ms=200
        ),
        step(call("call_out2", "final_result", **ANSWER), latency_ms=200),
    ],
)
AGENTS_DESK = FrameworkApp(
    package="agents_desk",
    agent="agents-desk",
    framework="openai-agents",
    adapter="openai_agents",
    steps=[
        *TOOL_STEPS,
        # A final answer that does not fit its type: the model is told, then answers again.
        final(json.dumps({"order_id": ORDER, "refunded_cents": "all", "summary": "x"}), 200),
        final(json.dumps(ANSWER), latency_ms=200),
    ],
)


def both_desks_env(stack: Stack, desk: Desk) -> dict[str, str]:
    """What a team with both agents sets: each agent's model, the desk, both modules named."""
    first, second = PYDANTIC_DESK.user_env(stack, desk), AGENTS_DESK.user_env(stack, desk)
    return {
        **first,
        **second,
        "PYTHONPATH": os.pathsep.join([str(PYDANTIC_DESK.example), second["PYTHONPATH"]]),
        "LIYAGENT_TOOLS": "pydantic_desk.durable_desk,agents_desk.durable_desk",
    }


def judge(desk: Desk) -> dict[str, int]:
    return {
        "refunds": desk.rows("SELECT count(*) AS n FROM refunds")[0]["n"],
        "emails": desk.rows("SELECT count(*) AS n FROM emails")[0]["n"],
    }


def runs_through(app: FrameworkApp, stack: Stack, desk: Desk) -> str:
    """One worker runs it to the right answer, each write once, each step asked once; the
    run's id, for what the framework told the model."""
    env = app.user_env(stack, desk)
    stack.worker(env=env)
    run_id = app.start(env)
    view = stack.wait(run_id)
    assert view.status == "succeeded", view
    assert view.output == ANSWER
    assert judge(desk) == {"refunds": 1, "emails": 1}
    assert stack.asked(run_id) == {1: 1, 2: 1, 3: 1, 4: 1, 5: 1}
    [refund] = desk.rows("SELECT idem_key, run_id FROM requests WHERE path = '/refunds'")
    assert refund["idem_key"] and refund["run_id"] == run_id
    # The framework's usage reached each step's write: the run's usage is what the model
    # server billed, step by step (each asked once).
    billed = stack.vendor(
        "SELECT prompt_tokens, completion_tokens FROM sim.requests WHERE vendor = 'model' "
        "AND run_id = :r AND status = 200",
        r=run_id,
    )
    assert len(billed) == 5
    assert (view.usage.input_tokens, view.usage.output_tokens) == (
        sum(u.prompt_tokens for u in billed),
        sum(u.completion_tokens for u in billed),
    )
    models = stack.rows("SELECT model FROM run_steps WHERE run_id = :r", r=run_id)
    assert models and all(m.model and m.model.startswith("script-") for m in models)
    return run_id


def resumes_a_write_in_flight(
    app: FrameworkApp, stack: Stack, desk: Desk, fault: str, expected: dict[str, int]
) -> None:
    """A worker SIGKILLed at `fault`; a survivor ends the run with the desk holding
    `expected` and no step asked twice."""
    env = app.user_env(stack, desk)
    run_id = stack.kill_then_resume(fault, lambda: app.start(env), env=env)
    view = stack.wait(run_id)
    assert view.status == "succeeded", view
    assert view.lost_count == 1
    assert view.output == ANSWER
    assert judge(desk) == expected
    # The model server's own records: no step was asked twice.
    asked = stack.asked(run_id)
    assert asked and set(asked.values()) == {1}, asked
    if fault == "after_send:kill":
        sent = desk.rows("SELECT idem_key, attempt, deduped FROM requests WHERE path = '/refunds'")
        assert [(r["attempt"], r["deduped"]) for r in sent] == [("1", 0), ("2", 1)]
        assert len({r["idem_key"] for r in sent}) == 1


def covers_a_lost_step(app: FrameworkApp, stack: Stack, desk: Desk) -> None:
    """A worker SIGKILLed once its framework's model answered step 1, before the step was
    written: that billed request is covered by the unconfirmed usage the claim of the loss
    recorded (the reservation noted before the framework's request), apart from the exact
    usage of the step the survivor wrote."""
    env = app.user_env(stack, desk)
    run_id = stack.kill_then_resume("after_model_step:kill", lambda: app.start(env), env=env)
    view = stack.wait(run_id)
    assert view.status == "succeeded", view
    assert stack.asked(run_id)[1] == 2
    assert uncovered(stack, run_id) == []
    assert view.usage.unconfirmed_input_tokens > 0


def resumes_a_kill_at_a_random_moment(app: FrameworkApp, stack: Stack, desk: Desk) -> None:
    """A worker SIGKILLed at a random moment after the first write (LIYAGENT_KILL_SEED picks
    it again); a survivor ends the run without a duplicate or a written step asked again."""
    seed = int(os.environ.get("LIYAGENT_KILL_SEED") or random.randrange(2**31))
    delay = random.Random(seed).uniform(0.0, 1.0)
    env = app.user_env(stack, desk)
    # The random moment (seed in the failure message).
    run_id = kill_after_the_first_write(stack, desk, env, lambda: app.start(env), delay)
    view = stack.wait(run_id)
    assert view.status == "succeeded", f"seed {seed}: {view}"
    assert view.output == ANSWER, f"seed {seed}: {view}"
    verdict = judge(desk)
    assert verdict["refunds"] == 1 and verdict["emails"] <= 1, f"seed {seed}: {verdict}"
    # No step written before the kill was asked again (I5); only the one in flight may be.
    asked = stack.asked(run_id)
    resumed = stack.rows(
        "SELECT step FROM audit_events WHERE run_id = :r AND kind = 'agent.run.crash_resumed'",
        r=run_id,
    )
    written = resumed[0].step if resumed else max(asked)
    assert all(n == 1 for k, n in asked.items() if k <= written), f"seed {seed}: {asked}"
    assert all(n <= 2 for n in asked.values()), f"seed {seed}: {asked}"
    # What the lost attempt was billed for the step in flight is covered by unconfirmed usage.
    assert uncovered(stack, run_id) == [], f"seed {seed}"


def refuses_to_start_on_wrong_kinds(
    app: FrameworkApp, stack: Stack, desk: Desk, home: Path, kinds: str, says: str
) -> None:
    """A worker whose module declares `kinds` exits 2 at start saying `says`, naming the
    module and the agent, without a traceback."""
    env = app.with_declarations(stack, desk, home, "broken_desk", kinds)
    done = subprocess.run(
        [sys.executable, "-m", "celery", "-A", "tasks", "worker", "-c", "1"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2, done.stderr[-2000:]
    assert "module broken_desk" in done.stderr
    assert f"{app.framework} agent {app.agent}" in done.stderr
    assert says in done.stderr and "Traceback" not in done.stderr


def refuses_an_unregistered_agent(app: FrameworkApp, stack: Stack) -> None:
    """A run naming a framework agent no module registers is refused when it is started."""
    with pytest.raises(BadRequest, match="no module LIYAGENT_TOOLS names registers"):
        stack.client.start_run(
            agent="ghost",
            model={"provider": "framework", "framework": app.framework, "agent": "ghost"},
            user_input="hi",
        )


def holds_a_refund_for_approval(app: FrameworkApp, stack: Stack, desk: Desk, home: Path) -> None:
    """The refund declared an approval write waits, unsent, for its approval; approved, it is
    sent with the approval's id as its key."""
    kinds = '{"lookup_order": "read", "issue_refund": "approval_write"}'
    env = app.with_declarations(stack, desk, home, "held_desk", kinds)
    stack.worker(env=env)
    run_id = app.start(env)
    view = stack.client.wait(run_id, timeout_s=60, until=frozenset({"waiting"}))
    [request] = stack.client.approvals(run_id)
    assert view.waiting_on == f"approval:{request.id}"
    assert desk.rows("SELECT count(*) AS n FROM refunds")[0]["n"] == 0  # held, not sent
    stack.client.decide(request.id, approve=True, by="alice")
    view = stack.wait(run_id)
    assert view.status == "succeeded", view
    assert view.output == ANSWER
    [refund] = desk.rows("SELECT idem_key FROM requests WHERE path = '/refunds'")
    assert refund["idem_key"] == request.id
