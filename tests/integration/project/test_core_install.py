"""The core alone runs a worker and a run: with every optional part's packages made unimportable
(as a `pip install liyagent` without extras leaves them), a worker starts, takes a run to its
answer with the built-in tools, and the parts that need an extra say which one (exit 2). The
front installed without the A2A and Teams extras starts without their routes, saying so."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import httpx

from liyagent.local.procs import ROOT
from tests.support.front import AUTH, serve_front
from tests.support.scripts import mixed

# Every optional part's top-level packages (pyproject.toml's extras).
EXTRAS_PACKAGES = (
    "starlette",
    "uvicorn",
    "sse_starlette",
    "a2a",
    "jwt",
    "mcp",
    "anthropic",
    "httpx2",
    "matplotlib",
    "flower",
)
# The packages of the A2A and Teams extras beyond the front's own.
KIND_PACKAGES = ("a2a", "jwt")
BLOCKER = '''
import sys

BLOCKED = {blocked!r}


class _NotInstalled:
    """As if the package were not installed: the import fails as a missing module."""

    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name.split(".")[0])
        return None


sys.meta_path.insert(0, _NotInstalled())
'''


def _core_only(tmp_path: Path, blocked: tuple[str, ...] = EXTRAS_PACKAGES) -> dict[str, str]:
    """The environment of a process that has only the core's packages (and those not
    `blocked`)."""
    site = tmp_path / "core-only"
    site.mkdir()
    (site / "sitecustomize.py").write_text(BLOCKER.format(blocked=blocked))
    path = os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH", "")]))
    return {"PYTHONPATH": path}


def test_a_worker_of_the_core_alone_runs_a_run(stack, tmp_path: Path) -> None:
    env = _core_only(tmp_path)
    worker = stack.worker("core", env=env)
    run_id = stack.start(mixed("core"))
    assert stack.wait(run_id).status == "succeeded"
    said = worker.output()
    assert "ModuleNotFoundError" not in said and "MissingExtra" not in said
    # The blocker was in force in the worker's processes.
    probe = subprocess.run(
        [sys.executable, "-c", "import starlette"],
        env={**stack.env, **env},
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert probe.returncode == 1 and "No module named 'starlette'" in probe.stderr


def test_a_part_without_its_extra_names_the_extra(stack, tmp_path: Path) -> None:
    env = {**stack.env, **_core_only(tmp_path)}
    for argv, extra in (
        (["serve", "--port", "0"], "liyagent[front]"),
        (["keys", "token", "ci", "--rights", "read"], "liyagent[front]"),
    ):
        done = subprocess.run(
            [sys.executable, "-m", "liyagent", *argv],
            env=env,
            capture_output=True,
            text=True,
            cwd=ROOT,
            timeout=60,
        )
        assert done.returncode == 2, (argv, done.stderr[-2000:])
        assert f"pip install '{extra}'" in done.stderr and "Traceback" not in done.stderr


def test_the_front_without_the_a2a_and_teams_extras_serves_without_their_routes(
    stack, tmp_path: Path
) -> None:
    agents = tmp_path / "agents.json"
    steps = {"steps": [{"final": "ok"}]}
    agents.write_text(
        json.dumps({"agents": {"reader": {"model": {"provider": "scripted", "script": steps}}}})
    )
    url = serve_front(stack, str(agents), _core_only(tmp_path, KIND_PACKAGES))
    with httpx.Client(base_url=url, headers=AUTH, timeout=30) as http:
        assert http.get("/healthz").status_code == 200
        assert (
            http.post("/webhooks/reader", json={"event_id": "e1", "input": "hi"}).status_code == 202
        )
        assert http.get("/.well-known/agent-card.json").status_code == 404
        assert http.post("/a2a", json={}).status_code == 404
        assert http.post("/api/messages", json={}).status_code == 404
    [front] = [p for p in stack.procs if p.name == "front"]
    said = front.output()
    assert "Traceback" not in said and "ModuleNotFoundError" not in said
    skipped = [json.loads(line) for line in said.splitlines() if "front.part_skipped" in line]
    assert sorted((x["part"], x["extra"]) for x in skipped) == [("a2a", "a2a"), ("teams", "teams")]
