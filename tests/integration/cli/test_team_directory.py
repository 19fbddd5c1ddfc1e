"""A team's own project directory, with a `tasks.py` and a `celeryconfig.py` of its own (Celery's
conventions, and liyagent's top-level names) and its tools in a package of its own on
PYTHONPATH. A worker started there the new way (`liyagent worker`, `celery -A liyagent.worker
worker`) runs a run to its end on the team's tools and never imports the team's `tasks` or
`celeryconfig`; `celery -A tasks` there loads the team's, as the team chose."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from liyagent.local.procs import Proc
from tests.support.scripts import call, final, step

# Each writes a file beside itself when imported: the proof of whether a process loaded it.
TEAM_TASKS = """
from pathlib import Path

Path(__file__).with_name("imported-tasks").write_text("the team's tasks.py")

from celery import Celery

app = Celery("team-app")
"""
TEAM_CELERYCONFIG = """
from pathlib import Path

Path(__file__).with_name("imported-celeryconfig").write_text("the team's celeryconfig.py")
broker_url = "memory://"
"""
TEAM_TOOLS = '''
import os
from typing import Any

from liyagent import CallContext, tool


@tool.read(name="team.greet")
def greet(ctx: CallContext, name: str) -> dict[str, Any]:
    """Greet someone, saying which process did."""
    return {"hello": name, "pid": os.getpid()}
'''
STEPS = [step(call("toolu_team_1", "team.greet", name="Ada")), final("Greeted Ada.")]


@pytest.fixture
def team(stack, tmp_path: Path, monkeypatch) -> Path:
    """The team's directory (its `tasks.py`, `celeryconfig.py`) and its package `deskteam`
    elsewhere, on PYTHONPATH for every process started from now on and named by
    LIYAGENT_TOOLS."""
    project = tmp_path / "project"
    project.mkdir()
    (project / "tasks.py").write_text(textwrap.dedent(TEAM_TASKS))
    (project / "celeryconfig.py").write_text(textwrap.dedent(TEAM_CELERYCONFIG))
    package = tmp_path / "site" / "deskteam"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text('"""The desk team\'s own package."""\n')
    (package / "tools.py").write_text(textwrap.dedent(TEAM_TOOLS))
    monkeypatch.setenv("PYTHONPATH", str(package.parent))
    monkeypatch.syspath_prepend(str(package.parent))
    stack.reconfigure(tool_modules=("deskteam.tools",))
    return project


def _imported(project: Path) -> list[str]:
    return sorted(p.name for p in project.glob("imported-*"))


def _start(stack, name: str, argv: list[str], project: Path, ready: str) -> Proc:
    proc = Proc(name, argv, stack.env, stack.tmp / f"{name}.log", cwd=project)
    stack.procs.append(proc)
    proc.wait_for(ready, timeout=60)
    return proc


WORKER_OPTIONS = ["-c", "1", "-n", "team@%h", "--without-gossip", "--without-mingle", "-l", "INFO"]


@pytest.mark.parametrize(
    "command",
    [
        [sys.executable, "-m", "liyagent", "worker"],
        [sys.executable, "-m", "celery", "-A", "liyagent.worker", "worker"],
    ],
    ids=["liyagent-worker", "celery-A-liyagent.worker"],
)
def test_a_worker_started_the_new_way_in_a_team_directory_runs_liyagent(
    stack, team: Path, command: list[str]
) -> None:
    q = stack.settings.queue
    worker = _start(stack, "team", [*command, "-Q", f"{q},{q}.ops", *WORKER_OPTIONS], team, "ready")
    run_id = stack.start(STEPS)
    view = stack.wait(run_id, timeout=60)
    assert view.status == "succeeded", (view, worker.output()[-3000:])
    assert view.answer == "Greeted Ada."
    # The team's tool ran, in the worker, not here.
    told = stack.told_by_tool(run_id, 2)["team.greet"]
    assert told["hello"] == "Ada" and told["pid"] != __import__("os").getpid()
    assert _imported(team) == [], "the worker imported the team's own tasks or celeryconfig"


def test_beat_started_the_new_way_in_a_team_directory_runs_liyagent(stack, team: Path) -> None:
    beat = [sys.executable, "-m", "liyagent", "beat", "-l", "INFO"]
    _start(stack, "team-beat", beat, team, r"beat: Starting")
    assert _imported(team) == []


def test_celery_A_tasks_in_a_team_directory_loads_the_teams_own(stack, team: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "celery", "-A", "tasks", "report"],
        cwd=team,
        env=stack.env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert _imported(team) == ["imported-tasks"]
