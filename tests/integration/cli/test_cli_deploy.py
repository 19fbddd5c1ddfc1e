"""`liyagent deploy check` on a fleet whose next code changes its tool set (issue 35, item 4):
run with the new code's settings against the live runs the old code started, it lists each run
that code would not serve as it started (a tool gone: drifts; a job kind, a model endpoint gone,
or a definition it cannot open: fails), with why, and exits 1 when any would fail."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.integration.cli.test_cli import cli
from tests.support.scripts import final
from tests.support.user_modules import install, write_module

OLD = '''
from typing import Any

from liyagent import CallContext, JobContext, JobParams, job, tool


@tool.read(name="desk.lookup")
def lookup(ctx: CallContext, order: str) -> dict[str, Any]:
    """Look an order up."""
    return {"order": order}


@tool.write(name="desk.refund")
def refund(ctx: CallContext, order: str) -> dict[str, Any]:
    """Refund an order."""
    return {"refunded": order}


class Nightly(JobParams):
    day: str


@job(kind="desk_nightly")
def nightly(ctx: JobContext, params: Nightly) -> dict[str, object]:
    """The nightly reconciliation."""
    return {"day": params.day}
'''
# The next version: the refund tool and the nightly job are gone.
NEW = '''
from typing import Any

from liyagent import CallContext, tool


@tool.read(name="desk.lookup")
def lookup(ctx: CallContext, order: str) -> dict[str, Any]:
    """Look an order up (the new code's)."""
    return {"order": order, "v": 2}
'''


@pytest.fixture
def runs(stack, tmp_path: Path, monkeypatch) -> dict[str, str]:
    """Live runs the old code started (no worker takes them: they stay queued), one of them
    stopped, and the new code beside it on PYTHONPATH."""
    install(stack, tmp_path / "site", monkeypatch, desk_v1=OLD)
    write_module(tmp_path / "site", "desk_v2", NEW)
    c = stack.client

    def agent(tools: list[str], model: dict) -> str:
        return c.start_run(agent="desk", model=model, user_input="hi", tools=tools)

    scripted = {"provider": "scripted", "script": {"steps": [final("ok")]}}
    started = {
        "both_tools": agent(["desk.lookup", "desk.refund"], scripted),
        "lookup_only": agent(["desk.lookup"], scripted),
        "endpoint": agent(["desk.lookup"], stack.model([final("ok")])),
        "job": c.start_job(kind="desk_nightly", params={"day": "2026-12-07"}),
        "ended": agent(["desk.refund"], scripted),
    }
    stack.rows("UPDATE runs SET status = 'failed' WHERE id = :r RETURNING id", r=started["ended"])
    return started


def _check(stack, *args: str, **env: str):
    return cli("deploy", "check", *args, env={**stack.env, **env})


def test_deploy_check_lists_what_the_new_code_would_not_serve_and_fails_on_a_failure(
    stack, runs: dict[str, str]
) -> None:
    same = _check(stack, "--json")
    assert same.returncode == 0, same.stderr
    assert json.loads(same.stdout) == {"checked": 4, "fail": 0, "drift": 0, "findings": []}
    # The new code: without the refund tool and the job kind, and a deployment that no longer
    # declares the model endpoint one run names.
    new = {"LIYAGENT_TOOLS": "desk_v2", "LIYAGENT_MODEL_PROFILES": ""}
    done = _check(stack, "--json", **new)
    assert done.returncode == 1, done.stderr
    report = json.loads(done.stdout)
    assert (report["checked"], report["fail"], report["drift"]) == (4, 2, 1)
    found = {(f["run_id"], f["verdict"]): f for f in report["findings"]}
    assert set(found) == {
        (runs["both_tools"], "drifts"),
        (runs["job"], "fails"),
        (runs["endpoint"], "fails"),
    }
    assert "tool desk.refund is gone" in found[(runs["both_tools"], "drifts")]["why"]
    assert "desk_nightly" in found[(runs["job"], "fails")]["why"]
    assert found[(runs["job"], "fails")]["status"] == "queued"
    assert "model" in found[(runs["endpoint"], "fails")]["why"]
    # The human table says the same, run by run, and the counts.
    human = _check(stack, **new, COLUMNS="250")
    assert human.returncode == 1
    assert runs["both_tools"] in human.stdout and runs["lookup_only"] not in human.stdout
    assert "4 runs in flight, waiting or queued checked against this code: 2 would fail" in (
        human.stdout
    )


def test_a_drift_alone_passes_unless_strict(stack, runs: dict[str, str]) -> None:
    # The new code keeps the job kind and the endpoint; only the refund tool is gone.
    stack.rows("UPDATE runs SET status = 'failed' WHERE id = ANY(CAST(:r AS uuid[])) RETURNING id",
               r=[runs["job"], runs["endpoint"]])  # fmt: skip
    new = {"LIYAGENT_TOOLS": "desk_v2"}
    assert _check(stack, **new).returncode == 0
    strict = _check(stack, "--strict", "--json", **new)
    assert strict.returncode == 1
    assert json.loads(strict.stdout)["drift"] == 1


def test_a_definition_the_new_code_cannot_open_would_fail(stack, runs: dict[str, str]) -> None:
    # The new deployment lost the seal key the runs were sealed with.
    other = "k2:" + "A" * 43 + "="
    done = _check(stack, "--json", LIYAGENT_SEAL_KEYS=other)
    assert done.returncode == 1, done.stderr
    report = json.loads(done.stdout)
    assert report["fail"] == 4
    assert all("does not open" in f["why"] for f in report["findings"])
