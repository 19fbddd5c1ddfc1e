"""A native agent's output type, on real workers: `agent(..., output=Triage)` in a team's own
module; the model is offered `final_result`, an answer that does not fit is told back to it
within the step limit, and the app reads the answer as a `Triage` (`RunView.output`, through
`client()` and `aclient()`), its JSON kept (`output_json`, and `output` itself in a process that
does not declare the agent). Judged from the model server's records and the sealed definition."""

from __future__ import annotations

import asyncio
import importlib
import json
import subprocess
import sys
import textwrap
from dataclasses import replace
from pathlib import Path

import pytest

from liyagent import BadRequest
from liyagent.local.procs import ROOT
from runtime import services as runtime_services
from runtime.entries.aclient import AsyncClient
from runtime.entries.client import Client
from runtime.entries.webhook import start_webhook
from tests.support.scripts import call, final, step
from tests.support.stack import TOOLS, RecordingPublisher
from tests.support.user_modules import install

MODULE = "acme_triage"
SOURCE = textwrap.dedent(
    '''
    """Acme's triage agents: each answer is a value of a type the app reads."""

    import os
    from dataclasses import dataclass
    from typing import Any, Literal

    from pydantic import BaseModel

    from liyagent import CallContext, agent, tool


    class Triage(BaseModel):
        """What the app reads of a triage."""

        ticket: str
        severity: Literal["low", "high"]
        summary: str


    @dataclass
    class Route:
        """Which team takes a ticket."""

        team: str
        ticket: str


    @tool.read(name="acme.ticket")
    async def ticket(ctx: CallContext, ticket: str) -> dict[str, Any]:
        """Read a support ticket."""
        base = os.environ["LIYAGENT_VENDOR_URL"].rstrip("/")
        response = await ctx.http.aget(f"{base}/tickets/{ticket}")
        response.raise_for_status()
        return response.json()


    triage = agent(
        "acme-triage",
        model={"profile": "sim", "model": os.environ["ACME_TRIAGE_MODEL"]},
        tools=[ticket],
        system="Read the ticket, then say how severe it is.",
        output=Triage,
    )
    route = agent(
        "acme-route",
        model={"profile": "sim", "model": os.environ["ACME_ROUTE_MODEL"]},
        output=Route,
    )
    '''
)
TRIAGE = {"ticket": "T-7", "severity": "high", "summary": "Checkout is down."}
TRIAGE_STEPS = [
    step(call("t1", "acme.ticket", ticket="T-7")),
    # Not a severity the type knows: refused, the model told why, asked again.
    step(call("o1", "final_result", **{**TRIAGE, "severity": "urgent"})),
    step(call("o2", "final_result", **TRIAGE)),
]
ROUTE_STEPS = [
    final("It goes to payments."),  # text, not the output tool: refused, told
    step(call("o1", "final_result", team="payments", ticket="T-9")),
]


@pytest.fixture
def acme(stack, tmp_path: Path, monkeypatch):
    """The module, written where only PYTHONPATH finds it, its agents' scripts served by the
    simulators' model, named in LIYAGENT_TOOLS for this process and every one started after."""
    monkeypatch.setenv("ACME_TRIAGE_MODEL", stack.model(TRIAGE_STEPS)["model"])
    monkeypatch.setenv("ACME_ROUTE_MODEL", stack.model(ROUTE_STEPS)["model"])
    install(stack, tmp_path / "acme", monkeypatch, **{MODULE: SOURCE})
    return importlib.import_module(MODULE)


def _undeclared_client(stack) -> Client:
    """The client of a process whose tool modules do not declare the agents."""
    settings = replace(stack.settings, tool_modules=TOOLS)
    return Client(runtime_services.build(settings, RecordingPublisher(), sealer=stack.sealer))


def test_a_native_agent_ends_with_a_value_of_its_output_type(stack, acme) -> None:
    stack.worker()
    run_id = stack.client.start_agent("acme-triage", "T-7: checkout fails")
    view = stack.wait(run_id)
    assert view.status == "succeeded", view
    assert isinstance(view.output, acme.Triage) and view.output == acme.Triage(**TRIAGE)
    assert view.output_json == TRIAGE and json.loads(view.answer) == TRIAGE
    assert view.output_as(dict) == TRIAGE and view.output_error is None
    # Offered the output tool beside its own; the answer that did not fit was told back.
    assert stack.offered(run_id, 1) == ["acme.ticket", "final_result"]
    told = stack.told_by_tool(run_id, 3)["final_result"]
    assert "severity" in told["error"] and "does not fit its type" in told["error"]
    assert stack.asked(run_id) == {1: 1, 2: 1, 3: 1}
    # The type the run started with is sealed with it.
    assert stack.definition(run_id).output == acme.Triage.model_json_schema()
    # A process that does not declare the agent reads the JSON.
    elsewhere = _undeclared_client(stack)
    try:
        other = elsewhere.get(run_id)
        assert other.output == TRIAGE and other.output_as(acme.Triage) == view.output
    finally:
        elsewhere.s.engine.dispose()
        elsewhere.s.redis.close()


def test_an_async_app_reads_a_dataclass_output_and_other_starts_carry_the_type(stack, acme) -> None:
    stack.worker()
    ac = AsyncClient(stack.client)

    async def app() -> tuple[str, object]:
        run_id = await ac.start_agent("acme-route", "T-9: the card was charged twice")
        return run_id, (await ac.wait(run_id, timeout_s=60)).output

    run_id, output = asyncio.run(app())
    assert output == acme.Route(team="payments", ticket="T-9")
    said = [m for m in stack.model_request(run_id, 2)["messages"] if m["role"] == "user"]
    assert "a final answer is given by calling final_result" in said[-1]["content"]
    # A webhook's run of the agent carries its type too, as does the CLI's.
    hooked, _ = start_webhook(stack.services, "acme-triage", "evt-1", "T-7", principal="ops")
    assert stack.definition(hooked).output == acme.Triage.model_json_schema()
    assert stack.wait(hooked).output == acme.Triage(**TRIAGE)
    argv = ["run", "--agent", "acme-triage", "--input", "T-7", "--wait", "--json"]
    ran = subprocess.run(
        [sys.executable, "-m", "liyagent.cli.main", *argv],
        env=stack.env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert ran.returncode == 0, ran.stderr
    assert json.loads(ran.stdout)["output"] == TRIAGE


def test_a_run_given_a_schema_is_checked_by_it_within_the_step_limit(stack) -> None:
    """`start_run(output=<JSON Schema>)`, on a worker that declares no such agent: the schema
    sealed with the run checks each answer; one that never fits fails at the step limit."""
    schema = {
        "type": "object",
        "properties": {"count": {"type": "integer", "minimum": 0}},
        "required": ["count"],
    }
    stack.extra_env["LIYAGENT_STEP_LIMIT"] = "2"
    stack.worker()
    fits = stack.client.start_run(
        agent="counter",
        model=stack.model(
            [step(call("o1", "final_result", count=-1)), step(call("o2", "final_result", count=3))]
        ),
        user_input="count",
        output=schema,
    )
    never = stack.client.start_run(
        agent="counter",
        model=stack.model([step(call(f"o{i}", "final_result", count="many")) for i in range(3)]),
        user_input="count",
        output=schema,
    )
    view = stack.wait(fits)
    assert view.status == "succeeded", view
    assert view.output == {"count": 3} == view.output_json
    failed = stack.wait(never)
    assert failed.status == "failed" and "step limit 2" in (failed.failure_reason or "")
    assert stack.asked(never) == {1: 1, 2: 1}
    with pytest.raises(BadRequest, match="output is not a valid JSON Schema"):
        stack.client.start_run(
            agent="counter", model=stack.model([final()]), user_input="x", output={"type": 5}
        )


@pytest.mark.kill
def test_a_refused_answer_is_written_and_a_killed_worker_resumes_after_it(stack, acme) -> None:
    """The worker is SIGKILLed as the model gives the answer that fits (step 3), after the
    refused one (step 2) was written: the survivor asks only step 3 again (I5) and ends the
    run with the typed value."""
    run_id = stack.kill_then_resume(
        "after_model_step:kill:3", lambda: stack.client.start_agent("acme-triage", "T-7")
    )
    view = stack.wait(run_id)
    assert view.status == "succeeded" and view.lost_count == 1, view
    assert view.output == acme.Triage(**TRIAGE)
    assert stack.asked(run_id) == {1: 1, 2: 1, 3: 2}
