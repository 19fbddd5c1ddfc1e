"""Every read is scoped to its principal: a run or an A2A task is seen by the principal whose
token started it, and by an operator (the `operate` right); to anyone else it answers exactly
as one that does not exist. Request keys (webhook event ids, A2A message ids) are scoped by
principal too: another caller's key never hands out their run id or a digest of their input.
The anonymous agent card publishes no system prompt, tool or model."""

from __future__ import annotations

import json
import re
import uuid
import warnings
from dataclasses import replace
from typing import Any

import httpx
import pytest
from starlette.exceptions import StarletteDeprecationWarning

from front.app import create_app
from front.auth import token_digest
from runtime import services as runtime_services
from runtime.entries.cron import fire_cron
from tests.support.scripts import call, final, step

with warnings.catch_warnings():
    warnings.simplefilter("ignore", StarletteDeprecationWarning)
    from starlette.testclient import TestClient

# Two tokens name `ci`: the one its service starts runs with, and the read-only one given to
# its browser, which follows the streams of ci's runs.
TOKENS = {
    "ci": ("ci", ["start"]),
    "ci-browser": ("ci", ["read"]),
    "other": ("other", ["start", "read", "stop"]),
    "viewer": ("viewer", ["read"]),
    "stopper": ("stopper", ["stop"]),
    "ops": ("ops", ["operate", "read", "stop"]),
}
SECRET_PROMPT = "You are the in-house triage bot; never reveal pricing rule 7."
SECRET_MODEL = "scripted-secret-marker"
HEX_DIGEST = re.compile(r"[0-9a-f]{64}")
# A run that asks a sub-agent, and answers with what it said.
DELEGATE = [
    step(
        call(
            "toolu_d1",
            "agent.delegate",
            agent="helper",
            input="Is T-5 a duplicate?",
            script={"steps": [final("T-5 is a duplicate.")]},
        )
    ),
    final("Closed as duplicate."),
]


def _bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer token-of-{token}"}


@pytest.fixture
def services(stack, tmp_path):
    catalog = {
        "agents": {
            "reader": {
                "model": {"provider": "scripted", "script": {"steps": [final(SECRET_MODEL)]}},
                "tools": ["incident.page", "ticket.read"],
                "system": SECRET_PROMPT,
                "description": "Reads tickets and says what they need.",
            },
            "delegator": {
                "model": {"provider": "scripted", "script": {"steps": DELEGATE}},
                "tools": ["agent.delegate"],
            },
        },
        "cron": [{"name": "digest", "agent": "reader", "input": "daily digest", "every_s": 60}],
    }
    agents = tmp_path / "agents.json"
    agents.write_text(json.dumps(catalog))
    tokens = tmp_path / "tokens.json"
    entries = [
        {"principal": name, "sha256": token_digest(f"token-of-{token}"), "rights": rights}
        for token, (name, rights) in TOKENS.items()
    ]
    tokens.write_text(json.dumps({"tokens": entries}))
    settings = replace(stack.settings, agents_file=str(agents), front_tokens_file=str(tokens))
    built = runtime_services.build(settings, stack.services.publisher, sealer=stack.sealer)
    yield built
    built.redis.close()


@pytest.fixture
def front(services):
    with TestClient(create_app(services)) as client:
        yield client


def _hook(front, token: str, event: str = "e1", text: str = "read T-7") -> httpx.Response:
    return front.post(
        "/webhooks/reader", json={"event_id": event, "input": text}, headers=_bearer(token)
    )


def _missing(answer: httpx.Response, run_id: str) -> None:
    """The answer is the one a run that does not exist gets (404, the same words)."""
    assert answer.status_code == 404, answer.text
    body = answer.json()
    assert body == {"error": body["error"], "run_id": run_id}
    assert f"run {run_id} does not exist" in body["error"]


def test_a_run_is_read_by_its_principal_and_operators_only(stack, front) -> None:
    run_id = _hook(front, "ci").json()["run_id"]
    assert front.get(f"/runs/{run_id}", headers=_bearer("ci")).json()["id"] == run_id
    assert front.get(f"/runs/{run_id}", headers=_bearer("ops")).status_code == 200
    for token in ("other", "viewer"):
        _missing(front.get(f"/runs/{run_id}", headers=_bearer(token)), run_id)
        _missing(front.get(f"/runs/{run_id}/events", headers=_bearer(token)), run_id)
    unknown = str(uuid.uuid4())
    _missing(front.get(f"/runs/{unknown}", headers=_bearer("other")), unknown)
    # The events route takes the token in the query too: the same scope.
    query = f"/runs/{run_id}/events?access_token=token-of-viewer"
    _missing(front.get(query), run_id)
    # ci's read-only browser token follows ci's run; `read` is still needed to follow one.
    stopped = front.post(f"/runs/{run_id}/stop", json={"reason": "done"}, headers=_bearer("ops"))
    assert stopped.status_code == 202
    events = front.get(f"/runs/{run_id}/events", headers=_bearer("ci-browser"))
    assert events.status_code == 200 and '"kind": "failed"' in events.text
    assert front.get(f"/runs/{run_id}/events", headers=_bearer("ci")).status_code == 403


def test_a_sub_agent_run_is_read_as_its_parents(stack, front) -> None:
    """A principal reads the sub-agent runs its runs started (their ids are in its events), and
    nobody else does."""
    stack.worker("w1")
    started = front.post(
        "/webhooks/delegator", json={"event_id": "d1", "input": "T-5?"}, headers=_bearer("ci")
    )
    parent = started.json()["run_id"]
    assert stack.wait(parent).answer == "Closed as duplicate."
    [child] = stack.rows("SELECT id, principal FROM runs WHERE parent_run_id = :p", p=parent)
    assert child.principal == "ci"
    seen = front.get(f"/runs/{child.id}", headers=_bearer("ci"))
    assert seen.status_code == 200 and seen.json()["answer"] == "T-5 is a duplicate."
    _missing(front.get(f"/runs/{child.id}", headers=_bearer("other")), child.id)


def test_runs_no_front_principal_started_are_seen_by_operators_only(stack, services, front) -> None:
    """The app's runs (client API) and cron's have no front principal (Teams' neither): no
    token but an operator's reads them, whatever id it guesses."""
    app_run = stack.start([final("app answer")])
    cron_run, _ = fire_cron(services, "digest")
    for run_id in (app_run, cron_run):
        for token in ("ci", "other", "viewer"):
            _missing(front.get(f"/runs/{run_id}", headers=_bearer(token)), run_id)
        assert front.get(f"/runs/{run_id}", headers=_bearer("ops")).status_code == 200


def test_a_request_key_never_crosses_principals(stack, front) -> None:
    """Another principal's event id makes its own run; a key reused with another request by
    the same principal is 409 naming its own run, with no digest anywhere."""
    first = _hook(front, "ci", "evt-9", "ci's private input")
    assert first.status_code == 202 and first.json()["created"] is True
    theirs = _hook(front, "other", "evt-9", "ci's private input")
    assert theirs.status_code == 202 and theirs.json()["created"] is True
    assert theirs.json()["run_id"] != first.json()["run_id"]
    # A key reused with another request: 409 naming the caller's own run, and no digest.
    for token, mine in (("ci", first), ("other", theirs)):
        conflict = _hook(front, token, "evt-9", "another input")
        assert conflict.status_code == 409
        assert conflict.json() == {
            "error": conflict.json()["error"],
            "run_id": mine.json()["run_id"],
        }
        assert not HEX_DIGEST.search(conflict.text)
    again = _hook(front, "ci", "evt-9", "ci's private input")
    assert again.json() == {**first.json(), "created": False}
    rows = stack.rows("SELECT principal, count(*) AS n FROM runs GROUP BY 1 ORDER BY 1")
    assert [(r.principal, r.n) for r in rows] == [("ci", 1), ("other", 1)]


def _a2a(front, token: str, method: str, params: dict[str, Any]) -> dict[str, Any]:
    body = {"jsonrpc": "2.0", "id": 1, "method": method, "params": params}
    answer = front.post("/a2a", json=body, headers={**_bearer(token), "A2A-Version": "1.0"})
    assert answer.status_code == 200, answer.text
    if answer.headers["content-type"].startswith("text/event-stream"):
        data = [line[5:] for line in answer.text.splitlines() if line.startswith("data:")]
        return dict(json.loads(data[0]))
    return dict(answer.json())


def _send(front, token: str, message_id: str, text: str) -> dict[str, Any]:
    message = {
        "message": {
            "messageId": message_id,
            "role": "ROLE_USER",
            "parts": [{"text": text}],
            "metadata": {"skill": "reader"},
        },
        "configuration": {"returnImmediately": True},
    }
    return dict(_a2a(front, token, "SendMessage", message)["result"]["task"])


def _not_found(answer: dict[str, Any]) -> None:
    assert answer["error"]["code"] == -32001, answer  # TaskNotFoundError


def test_a2a_tasks_are_read_by_their_principal_and_operators_only(stack, front) -> None:
    mine = _send(front, "ci", f"msg-{uuid.uuid4().hex}", "ci's secret question")
    theirs = _send(front, "other", f"msg-{uuid.uuid4().hex}", "other's question")
    listed = _a2a(front, "other", "ListTasks", {})["result"]
    assert [t["id"] for t in listed["tasks"]] == [theirs["id"]]
    assert listed["totalSize"] == 1 and "ci's secret" not in json.dumps(listed)
    nothing = _a2a(front, "viewer", "ListTasks", {})["result"]
    assert nothing.get("tasks", []) == [] and nothing.get("totalSize", 0) == 0
    for token in ("other", "viewer"):
        _not_found(_a2a(front, token, "GetTask", {"id": mine["id"]}))
        _not_found(_a2a(front, token, "SubscribeToTask", {"id": mine["id"]}))
    _not_found(_a2a(front, "stopper", "CancelTask", {"id": mine["id"]}))
    got = _a2a(front, "ci", "GetTask", {"id": mine["id"]})["result"]
    assert got["history"][0]["parts"] == [{"text": "ci's secret question"}]
    assert _a2a(front, "ops", "ListTasks", {})["result"]["totalSize"] == 2


def test_an_a2a_message_id_is_a_task_per_principal(stack, front) -> None:
    """The same message id from another principal is that principal's own task (named after
    it, as ever); each principal reads and cancels its own, an operator gets the first."""
    message_id = f"msg-{uuid.uuid4().hex}"
    mine = _send(front, "ci", message_id, "ci's secret question")
    theirs = _send(front, "other", message_id, "other's question")
    assert mine["id"] == theirs["id"] == message_id
    assert theirs["metadata"]["run_id"] != mine["metadata"]["run_id"]
    assert "ci's secret" not in json.dumps(theirs)
    got = _a2a(front, "ci", "GetTask", {"id": message_id})["result"]
    assert got["metadata"]["run_id"] == mine["metadata"]["run_id"]
    first = _a2a(front, "ops", "GetTask", {"id": message_id})["result"]
    assert first["metadata"]["run_id"] == mine["metadata"]["run_id"]
    canceled = _a2a(front, "other", "CancelTask", {"id": message_id})["result"]
    assert canceled["status"]["state"] == "TASK_STATE_CANCELED"
    assert canceled["metadata"]["run_id"] == theirs["metadata"]["run_id"]
    still = _a2a(front, "ci", "GetTask", {"id": message_id})["result"]
    assert still["status"]["state"] == "TASK_STATE_SUBMITTED"


def test_the_anonymous_card_publishes_no_prompt_tool_or_model(front) -> None:
    card = front.get("/.well-known/agent-card.json")
    assert card.status_code == 200
    text = card.text
    assert "pricing rule 7" not in text and SECRET_PROMPT not in text
    for secret in ("incident.page", "ticket.read", "agent.delegate", "scripted", SECRET_MODEL):
        assert secret not in text, secret
    assert '"model"' not in text and '"system"' not in text and '"tools"' not in text
    skills = {s["id"]: s for s in card.json()["skills"]}
    assert sorted(skills) == ["delegator", "reader"]
    assert skills["reader"]["description"] == "Reads tickets and says what they need."
    assert skills["delegator"]["description"] == "The delegator agent."
