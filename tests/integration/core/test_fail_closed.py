"""Runs fail closed at every door: a run is offered exactly the tools it names (none when it
names none), an unknown tool name or a bad model spec is refused before anything is stored, and
a secret never reaches `runs.spec`, an error message or a log line. Judged from Postgres (rows
counted) and from the model server's record of what the model was offered."""

from __future__ import annotations

import json
import re
import warnings
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from starlette.exceptions import StarletteDeprecationWarning

from front.app import create_app
from runtime import services as runtime_services
from runtime.entries.client import BadRequest
from runtime.entries.start import start_entry
from runtime.entries.teams.inbox import TeamsTurn, receive_teams
from tests.integration.cli.test_cli import cli
from tests.support.scripts import call, final, step

with warnings.catch_warnings():
    warnings.simplefilter("ignore", StarletteDeprecationWarning)
    from starlette.testclient import TestClient

SECRET = "sk-live-0123456789abcdefSECRET"
EVIL = "http://evil.example/v1"
READ = [step(call("toolu_fc_r", "ticket.read", ticket="T-7")), final("Read T-7.")]
TOKEN = "fc-token"


def _counts(stack) -> tuple[int, int]:
    """Runs and Teams inbox rows stored: what a refusal must leave at zero."""
    runs = stack.rows("SELECT count(*) AS n FROM runs")[0].n
    inbox = stack.rows("SELECT count(*) AS n FROM teams_inbox")[0].n
    return runs, inbox


def _catalog(tmp_path: Path, agents: dict[str, Any]) -> str:
    path = tmp_path / "fail-closed-agents.json"
    path.write_text(json.dumps({"agents": agents}))
    return str(path)


def _openai(**fields: Any) -> dict[str, Any]:
    return {"provider": "openai", "model": "gpt-test", **fields}


def test_a_run_that_names_no_tools_is_offered_none(stack) -> None:
    stack.worker("w1")
    bare = stack.client.start_run(agent="bare", model=stack.model(READ), user_input="T-7?")
    named = stack.client.start_run(
        agent="named", model=stack.model(READ), user_input="T-7?", tools=["ticket.read"]
    )
    assert stack.wait(bare).status == "succeeded" and stack.wait(named).status == "succeeded"
    # What the model server was sent: no tool at all, then exactly the one named.
    assert stack.offered(bare, 1) == []
    assert stack.offered(named, 1) == ["ticket.read"]
    # The call the model made anyway was refused and never reached the vendor.
    refused = stack.told_by_tool(bare, 2)["ticket.read"]
    assert "not among the tools this run may use" in refused["refused"]
    reads = "SELECT count(*) AS n FROM sim.requests WHERE run_id = :r AND vendor <> 'model'"
    assert stack.vendor(reads, r=bare)[0].n == 0
    assert stack.vendor(reads, r=named)[0].n == 1
    assert stack.definition(bare).tools == []


@pytest.mark.parametrize(
    ("start", "says"),
    [
        (
            {"tools": ["ticket.read", "rm.rf"]},
            "names tools this deployment has not loaded: rm.rf; known: agent.delegate",
        ),
        ({"model": _openai(api_key=SECRET)}, "model.api_key: a secret is never put"),
        ({"model": _openai(api_key_env=SECRET)}, "looks like an API key"),
        # The probe: a worker's own secret as the key, sent to the caller's endpoint.
        (
            {"model": _openai(base_url=EVIL, api_key_env="LIYAGENT_TEAMS_APP_PASSWORD")},
            "model.base_url: not a model endpoint this deployment declares",
        ),
        (
            {"model": _openai(api_key_env="LIYAGENT_SEAL_KEYS")},
            "model.api_key_env: not the variable this deployment lists",
        ),
        ({"model": _openai(base_url=f"https://u:{SECRET}@api.openai.com/v1")}, "credentials"),
        ({"model": _openai(headers={"Authorization": "x"})}, "model.headers: a secret"),
        (
            {"model": {"provider": "opnai", "model": "m"}},
            "known: anthropic, framework, openai, scripted",
        ),
        ({"model": _openai(temprature=0.2)}, "temprature: Extra inputs are not permitted"),
        ({"model": _openai(api_key_env="MY KEY")}, "api_key_env: String should match"),
        ({"model": {"provider": "anthropic"}}, "model.model: name the model"),
    ],
)
def test_a_bad_request_through_the_client_stores_nothing(stack, start, says) -> None:
    options = {"model": stack.model(READ), "tools": ["ticket.read"], **start}
    with pytest.raises(BadRequest) as info:
        stack.client.start_run(agent="bad", user_input="T-7?", **options)
    message = str(info.value)
    assert says in message and "nothing was stored" in message
    assert SECRET not in message
    assert "evil.example" not in message
    if "a secret" in says or "looks like" in says:
        assert "LIYAGENT_MODEL_PROFILES" in message  # says what to do instead
    assert _counts(stack) == (0, 0)


def test_a_workflow_may_call_only_the_tools_its_steps_name(stack) -> None:
    bad = {"start": "a", "steps": {"a": {"tool": "rm.rf", "args": {}}}}
    with pytest.raises(BadRequest, match=r"rm\.rf; known: "):
        stack.client.start_workflow(name="wf", workflow=bad)
    assert _counts(stack) == (0, 0)
    good = {"start": "a", "steps": {"a": {"tool": "ticket.read", "args": {"ticket": "T-1"}}}}
    run_id = stack.client.start_workflow(name="wf", workflow=good)
    assert stack.definition(run_id).tools == ["ticket.read"]


TYPO = {"typo": {"tools": ["ticket.raed"], "model": {"script": {"steps": [final("x")]}}}}
LEAKY = {"leaky": {"tools": ["ticket.read"], "model": _openai(api_key=SECRET)}}


def test_catalog_agents_are_checked_at_every_entry_point(stack, tmp_path: Path) -> None:
    """An agent naming a tool this deployment has not loaded is refused at every door; one
    whose model holds a secret refuses the whole catalog when it is read, naming the agent."""
    path = _catalog(tmp_path, TYPO)
    stack.reconfigure(agents_file=path)
    ann = "0b0a0000-0000-0000-0000-00000000a11e"
    turn = TeamsTurn("a-1", "conv-1", stack.sim_url, ann, "hi", {"id": "a-1"})
    with pytest.raises(BadRequest, match=re.escape("ticket.raed")):
        start_entry(
            stack.services,
            entry_kind="webhook",
            agent="typo",
            user_input="x",
            request_key="webhook:typo:e1",
            owner="hooks",
            channel="webhook",
        )
    with pytest.raises(BadRequest, match=re.escape("ticket.raed")):
        receive_teams(stack.services, turn, "typo")
    assert _catalog(tmp_path, {**TYPO, **LEAKY}) == path  # the file changes under the process
    with pytest.raises(BadRequest, match=re.escape("agent 'leaky': model.api_key")) as info:
        receive_teams(stack.services, turn, "typo")
    assert SECRET not in str(info.value)
    assert _counts(stack) == (0, 0)


def test_the_front_says_a_catalog_with_a_secret_is_the_deployments_to_fix(
    stack, tmp_path: Path
) -> None:
    settings = replace(stack.settings, agents_file=_catalog(tmp_path, LEAKY), front_token=TOKEN)
    services = runtime_services.build(settings, stack.services.publisher, sealer=stack.sealer)
    headers = {"Authorization": f"Bearer {TOKEN}"}
    with TestClient(create_app(services), headers=headers) as front:
        done = front.post("/webhooks/leaky", json={"event_id": "e1", "input": "x"})
    assert done.status_code == 500, done.text  # the deployment's file, not the caller's input
    assert "agent 'leaky': model.api_key" in done.text and SECRET not in done.text
    assert _counts(stack) == (0, 0)


def test_the_cli_refuses_unknown_tools_and_inline_keys_with_exit_2(stack, tmp_path: Path) -> None:
    env = {**stack.env, "LIYAGENT_AGENTS_FILE": _catalog(tmp_path, TYPO)}
    typo = cli("run", "--agent", "typo", "--input", "x", env=env)
    assert typo.returncode == 2, typo.stderr
    assert "ticket.raed; known: agent.delegate" in typo.stderr and "ticket.read" in typo.stderr
    env["LIYAGENT_AGENTS_FILE"] = _catalog(tmp_path, {**TYPO, **LEAKY})
    leaky = cli("run", "--agent", "typo", "--input", "x", env=env)
    assert leaky.returncode == 2, leaky.stderr
    assert "agent 'leaky': model.api_key" in leaky.stderr
    assert "LIYAGENT_MODEL_PROFILES" in leaky.stderr and SECRET not in leaky.stderr + leaky.stdout
    assert _counts(stack) == (0, 0)
