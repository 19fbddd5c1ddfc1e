"""`liyagent deploy check` on a fleet whose next code changes its tool set (issue 35, item 4):
run with the new code's settings against the live runs the old code started, it lists each run
that code would not serve as it started, with why, and exits 1 when any would fail: a pinned
run whose tool is gone (it would wait for a worker of the old code, and fail once none
remains), a job kind or a model endpoint gone, a definition it cannot open. A run that follows
the latest definition, or one stored before pins, drifts (continues without the tool)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.integration.cli.test_cli import cli
from tests.support.desk_code import DESK_V1, DESK_V2
from tests.support.scripts import final
from tests.support.user_modules import install, write_module


@pytest.fixture
def runs(stack, tmp_path: Path, monkeypatch) -> dict[str, str]:
    """Live runs the old code started (no worker takes them: they stay queued), one of them
    stopped, and the new code beside it on PYTHONPATH."""
    install(stack, tmp_path / "site", monkeypatch, desk_v1=DESK_V1)
    write_module(tmp_path / "site", "desk_v2", DESK_V2)
    c = stack.client

    def agent(tools: list[str], model: dict, policy: str = "pinned") -> str:
        return c.start_run(
            agent="desk", model=model, user_input="hi", tools=tools, definition_policy=policy
        )

    scripted = {"provider": "scripted", "script": {"steps": [final("ok")]}}
    started = {
        "both_tools": agent(["desk.lookup", "desk.refund"], scripted),
        "following": agent(["desk.lookup", "desk.refund"], scripted, "follow_latest"),
        "legacy": agent(["desk.lookup", "desk.refund"], scripted),
        "lookup_only": agent(["desk.lookup"], scripted),
        "endpoint": agent(["desk.lookup"], stack.model([final("ok")])),
        "job": c.start_job(kind="desk_nightly", params={"day": "2026-12-07"}),
        "ended": agent(["desk.refund"], scripted),
    }
    stack.rows("UPDATE runs SET status = 'failed' WHERE id = :r RETURNING id", r=started["ended"])
    # As a run stored before pins was.
    stack.rows("UPDATE runs SET pin = NULL WHERE id = :r RETURNING id", r=started["legacy"])
    return started


def _check(stack, *args: str, **env: str):
    return cli("deploy", "check", *args, env={**stack.env, **env})


def test_deploy_check_lists_what_the_new_code_would_not_serve_and_fails_on_a_failure(
    stack, runs: dict[str, str]
) -> None:
    same = _check(stack, "--json")
    assert same.returncode == 0, same.stderr
    assert json.loads(same.stdout) == {"checked": 6, "fail": 0, "drift": 0, "findings": []}
    # The new code: without the refund tool and the job kind, and a deployment that no longer
    # declares the model endpoint one run names.
    new = {"LIYAGENT_TOOLS": "desk_v2", "LIYAGENT_MODEL_PROFILES": ""}
    done = _check(stack, "--json", **new)
    assert done.returncode == 1, done.stderr
    report = json.loads(done.stdout)
    assert (report["checked"], report["fail"], report["drift"]) == (6, 3, 2)
    found = {(f["run_id"], f["verdict"]): f for f in report["findings"]}
    assert set(found) == {
        (runs["both_tools"], "fails"),
        (runs["following"], "drifts"),
        (runs["legacy"], "drifts"),
        (runs["job"], "fails"),
        (runs["endpoint"], "fails"),
    }
    pinned = found[(runs["both_tools"], "fails")]["why"]
    assert "tool desk.refund is gone" in pinned and "pinned" in pinned
    assert "re-pinned" in found[(runs["following"], "drifts")]["why"]
    assert "tool desk.refund is gone" in found[(runs["legacy"], "drifts")]["why"]
    assert "desk_nightly" in found[(runs["job"], "fails")]["why"]
    assert found[(runs["job"], "fails")]["status"] == "queued"
    assert "model" in found[(runs["endpoint"], "fails")]["why"]
    # The human table says the same, run by run, and the counts.
    human = _check(stack, **new, COLUMNS="250")
    assert human.returncode == 1
    assert runs["both_tools"] in human.stdout and runs["lookup_only"] not in human.stdout
    assert "6 runs in flight, waiting or queued checked against this code: 3 would fail" in (
        human.stdout
    )


def test_a_drift_alone_passes_unless_strict(stack, runs: dict[str, str]) -> None:
    # The new code keeps the job kind and the endpoint; only the refund tool is gone, and the
    # runs it is left to would continue without it (the pinned one has ended).
    stack.rows("UPDATE runs SET status = 'failed' WHERE id = ANY(CAST(:r AS uuid[])) RETURNING id",
               r=[runs["job"], runs["endpoint"], runs["both_tools"]])  # fmt: skip
    new = {"LIYAGENT_TOOLS": "desk_v2"}
    assert _check(stack, **new).returncode == 0
    strict = _check(stack, "--strict", "--json", **new)
    assert strict.returncode == 1
    assert json.loads(strict.stdout)["drift"] == 2


def test_a_definition_the_new_code_cannot_open_would_fail(stack, runs: dict[str, str]) -> None:
    # The new deployment lost the seal key the runs were sealed with.
    other = "k2:" + "A" * 43 + "="
    done = _check(stack, "--json", LIYAGENT_SEAL_KEYS=other)
    assert done.returncode == 1, done.stderr
    report = json.loads(done.stdout)
    assert report["fail"] == 6
    assert all("does not open" in f["why"] for f in report["findings"])


def test_deploy_status_counts_the_live_runs_by_the_version_they_are_pinned_to(
    stack, runs: dict[str, str]
) -> None:
    done = cli("deploy", "status", "--json", env=stack.env)
    assert done.returncode == 0, done.stderr
    versions = json.loads(done.stdout)["versions"]
    by_pin = {v["pin"]: v for v in versions}
    # Same tools, same policy: one version; the follower's and the lookup-only runs' others;
    # the run stored before pins apart.
    assert sum(sum(v["runs"].values()) for v in versions) == 6
    assert by_pin["(none: stored before pins)"]["runs"] == {"queued": 1}
    assert {v["policy"] for v in versions} == {"pinned", "follow_latest", None}
    assert all(v["waiting_for_code"] == 0 for v in versions)
    human = cli("deploy", "status", env={**stack.env, "COLUMNS": "250"})
    assert human.returncode == 0 and "6 live runs over" in human.stdout
