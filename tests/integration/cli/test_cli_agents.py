"""`liyagent run --agent NAME --input TEXT`: a catalog agent (from the catalog file, or declared
in Python in a tool module) runs with its own model, tools and system prompt; an unknown agent
is bad input that stores nothing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

from liyagent.local.procs import ROOT
from tests.integration.cli.test_cli import cli, run_count
from tests.support.catalogs import write_catalog
from tests.support.scripts import call, final, step
from tests.support.stack import sim_model


def test_a_catalog_agent_runs_with_its_model_and_tools(stack, tmp_path: Path) -> None:
    stack.reconfigure(agents_file=write_catalog(tmp_path / "agents.json", stack.sim_url))
    stack.worker()
    done = cli(
        "run", "--agent", "helper", "--input", "hello", "--wait", "--json",
        "--request-key", "cli-agent-1", env=stack.env,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    view = json.loads(done.stdout)
    assert view["status"] == "succeeded" and view["answer"] == "Answer from helper."
    [run] = stack.rows("SELECT id, agent FROM runs")
    tools = stack.definition(str(run.id)).tools
    assert run.agent == "helper" and tools == ["ticket.read", "issue.comment"]
    assert stack.posts_by_vendor(str(run.id)) == {"issues": 1}
    again = cli(
        "run", "--agent", "helper", "--input", "hello", "--request-key", "cli-agent-1",
        env=stack.env,
    )  # fmt: skip
    assert again.returncode == 0 and again.stdout.strip() == str(run.id)
    assert run_count(stack) == 1


def test_an_agent_declared_in_python_runs_from_the_cli(stack, tmp_path: Path) -> None:
    steps = [step(call("toolu_py_1", "ticket.read", ticket="T-8")), final("Read T-8.")]
    model = sim_model(stack.sim_url, steps)
    (tmp_path / "desk_agents.py").write_text(
        textwrap.dedent(
            f"""
            from liyagent import agent

            triage = agent(
                "triage",
                model={model!r},
                tools=["ticket.read"],
                system="You triage tickets.",
            )
            """
        )
    )
    env = {
        **stack.env,
        "PYTHONPATH": f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
        "LIYAGENT_TOOLS": "liyagent.vendor_tools,desk_agents",
    }
    stack.worker(env=env)
    done = cli("run", "--agent", "triage", "--input", "T-8?", "--wait", "--json", env=env)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["answer"] == "Read T-8."
    [run] = stack.rows("SELECT id FROM runs")
    assert stack.definition(str(run.id)).system == "You triage tickets."


def test_an_unknown_agent_exits_2_listing_the_known_ones(stack, tmp_path: Path) -> None:
    stack.reconfigure(agents_file=write_catalog(tmp_path / "agents.json", stack.sim_url))
    done = cli("run", "--agent", "nobody", "--input", "hi", env=stack.env)
    assert done.returncode == 2
    assert "no agent named 'nobody'" in done.stderr and "known: helper" in done.stderr
    assert "nothing was stored" in done.stderr and "Traceback" not in done.stderr
    assert run_count(stack) == 0


def test_start_agent_from_python_with_the_public_api(stack, tmp_path: Path) -> None:
    stack.reconfigure(agents_file=write_catalog(tmp_path / "agents.json", stack.sim_url))
    stack.worker()
    code = (
        "from liyagent import client, start_agent\n"
        "run = start_agent('helper', 'hello', request_key='py-1')\n"
        "assert start_agent('helper', 'hello', request_key='py-1') == run\n"
        "print(client().wait(run, timeout_s=60).answer)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=stack.env, capture_output=True, text=True,
        timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "Answer from helper."
    assert run_count(stack) == 1
