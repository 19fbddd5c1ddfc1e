"""liyagent's top-level names in a team's directory (liyagent/own_modules.py): the list is what
liyagent installs; liyagent's app module refuses a team's `tasks` imported before it; an app
process whose `tasks` is the team's is told which module clashes, not a bare ImportError.
tests/integration/cli/test_team_directory.py runs workers and beat there."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

from liyagent import own_modules
from liyagent.local.procs import ROOT

TEAM_TASKS = "from celery import Celery\napp = Celery('team-app')\n"


def _python(code: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code], cwd=cwd, capture_output=True, text=True, timeout=60
    )


def test_the_names_are_every_top_level_module_liyagent_installs() -> None:
    setup = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    packages = {p.rstrip("*") for p in setup["packages"]["find"]["include"]}
    assert (set(setup["py-modules"]) | packages) - {"liyagent"} == own_modules.OWN


def test_the_names_are_found_where_liyagent_is_installed() -> None:
    for name in own_modules.OWN:
        assert own_modules._foreign(name) is None, name


def test_the_app_module_refuses_a_team_tasks_imported_before_it(tmp_path: Path) -> None:
    (tmp_path / "tasks.py").write_text(TEAM_TASKS)
    done = _python("import tasks, liyagent.worker", tmp_path)
    assert done.returncode != 0
    assert "ForeignModule: the module 'tasks' here is " in done.stderr
    assert str(tmp_path / "tasks.py") in done.stderr and "rename the team's module" in done.stderr


def test_an_app_process_whose_tasks_is_the_teams_is_told_which_clashes(tmp_path: Path) -> None:
    """`python app.py` in a team's directory: its `tasks.py` comes first on sys.path, so
    liyagent's client (published through liyagent's Celery app, the package `tasks`) cannot
    load; it says which module clashes and what to do, and nothing of it was imported."""
    (tmp_path / "tasks.py").write_text(TEAM_TASKS)
    done = _python("import liyagent; liyagent.client()", tmp_path)
    assert done.returncode != 0
    assert "ForeignModule: the module 'tasks' here is " in done.stderr
    assert "import it under its package" in done.stderr
    assert "is not a package" not in done.stderr
