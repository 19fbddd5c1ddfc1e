"""The front's tokens name principals with rights: who decides or stops is the token's
principal (never a name in the body), a token without a right gets 403 naming it, stops of
runs and agents are lifted over HTTP, and a request key that names another request is 409
(reads scoped to their principal: test_front_scope.py)."""

from __future__ import annotations

import json
import uuid
import warnings
from dataclasses import replace

import pytest
from starlette.exceptions import StarletteDeprecationWarning

from front.app import create_app
from front.auth import token_digest
from runtime import services as runtime_services
from tests.support.scripts import call, final, step

with warnings.catch_warnings():
    warnings.simplefilter("ignore", StarletteDeprecationWarning)
    from starlette.testclient import TestClient

RIGHTS = {"alice": ["decide"], "ops": ["stop"], "ci": ["start", "stop"], "viewer": []}
PAGE = [
    step(call("toolu_p1", "incident.page", title="Checkout down", severity="sev1")),
    final("Paged."),
]


def _bearer(name: str) -> dict[str, str]:
    return {"Authorization": f"Bearer token-of-{name}"}


@pytest.fixture
def front(stack, tmp_path):
    catalog = {"agents": {"reader": {"model": {"provider": "scripted",
                                               "script": {"steps": [final("ok")]}}}}}  # fmt: skip
    agents = tmp_path / "agents.json"
    agents.write_text(json.dumps(catalog))
    tokens = tmp_path / "tokens.json"
    entries = [
        {"principal": name, "sha256": token_digest(f"token-of-{name}"), "rights": rights}
        for name, rights in RIGHTS.items()
    ]
    tokens.write_text(json.dumps({"tokens": entries}))
    settings = replace(stack.settings, agents_file=str(agents), front_tokens_file=str(tokens))
    services = runtime_services.build(settings, stack.services.publisher, sealer=stack.sealer)
    with TestClient(create_app(services)) as client:
        yield client
    services.redis.close()


def _count(stack, table: str) -> int:
    return stack.rows(f"SELECT count(*) AS n FROM {table}")[0].n


def _hook(front, who: str, event: str = "e1", text: str = "read T-7"):
    return front.post("/webhooks/reader", json={"event_id": event, "input": text},
                      headers=_bearer(who))  # fmt: skip


def test_rights_are_checked_and_each_missing_one_is_named(stack, front) -> None:
    refused = _hook(front, "viewer")
    assert refused.status_code == 403
    assert refused.json()["right"] == "start" and "principal viewer" in refused.json()["error"]
    assert (
        front.post("/webhooks/reader", json={}, headers={"Authorization": "Bearer x"}).status_code
        == 401
    )
    started = _hook(front, "ci")
    assert started.status_code == 202
    run_id = started.json()["run_id"]
    assert front.get(f"/runs/{run_id}", headers=_bearer("ci")).status_code == 200
    # Reading needs no right, but another principal's run is not there for it.
    assert front.get(f"/runs/{run_id}", headers=_bearer("viewer")).status_code == 404
    for who, path, body, right in [
        ("viewer", f"/runs/{run_id}/stop", {"reason": "r"}, "stop"),
        ("alice", "/agents/reader/stop", {"reason": "r"}, "stop"),
        ("ops", f"/approvals/{uuid.uuid4()}/decision", {"approve": True}, "decide"),
        ("viewer", f"/runs/{run_id}/stop/lift", {}, "stop"),
    ]:
        answer = front.post(path, json=body, headers=_bearer(who))
        assert answer.status_code == 403 and answer.json()["right"] == right, (who, path)
    assert _count(stack, "stops") == 0


def test_who_stops_and_lifts_is_the_tokens_principal(stack, front) -> None:
    run_id = _hook(front, "ci").json()["run_id"]
    spoofed = front.post(f"/runs/{run_id}/stop", json={"reason": "r", "by": "alice"},
                         headers=_bearer("ops"))  # fmt: skip
    assert spoofed.status_code == 400 and "principal of your bearer token (ops)" in spoofed.text
    assert _count(stack, "stops") == 0
    stopped = front.post(f"/runs/{run_id}/stop", json={"reason": "wrong input"},
                         headers=_bearer("ops"))  # fmt: skip
    assert stopped.status_code == 202 and stopped.json()["by"] == "ops"
    view = stack.client.get(run_id)
    assert (view.status, view.failure_reason) == ("failed", "stopped by ops: wrong input")
    lifted = front.post(f"/runs/{run_id}/stop/lift", json={}, headers=_bearer("ops"))
    assert lifted.status_code == 200 and lifted.json()["by"] == "ops"
    again = front.post(f"/runs/{run_id}/stop/lift", json={}, headers=_bearer("ops"))
    assert again.status_code == 404 and "no stop stands" in again.json()["error"]
    assert front.post("/agents/ghost/stop", json={"reason": "r"},
                      headers=_bearer("ops")).status_code == 404  # fmt: skip
    assert front.post("/agents/a:b/stop", json={"reason": "r"},
                      headers=_bearer("ops")).status_code == 400  # fmt: skip
    paused = front.post("/agents/reader/stop", json={"reason": "paused"}, headers=_bearer("ops"))
    assert paused.status_code == 202, paused.text
    lift = front.post("/agents/reader/stop/lift", json={"reason": "fixed"}, headers=_bearer("ops"))
    assert lift.status_code == 200 and len(lift.json()["lifted"]) == 1
    rows = stack.rows("SELECT created_by, lifted_by FROM stops ORDER BY id")
    assert [(r.created_by, r.lifted_by) for r in rows] == [("ops", "ops"), ("ops", "ops")]
    audit = stack.rows(
        "SELECT detail FROM audit_events WHERE kind IN ('agent.stop.created', "
        "'agent.stop.lifted') ORDER BY id"
    )
    assert [a.detail["by"] for a in audit] == ["ops"] * 4


def test_who_decides_is_the_tokens_principal(stack, front) -> None:
    stack.worker("w1")
    run_id = stack.start(PAGE)
    stack.client.wait(run_id, timeout_s=60, until=frozenset({"waiting"}))
    [approval] = stack.client.approvals(run_id)
    path = f"/approvals/{approval.id}/decision"
    spoofed = front.post(path, json={"approve": True, "by": "bob"}, headers=_bearer("alice"))
    assert spoofed.status_code == 400
    assert stack.client.approvals(run_id)[0].status == "pending"
    decided = front.post(path, json={"approve": True}, headers=_bearer("alice"))
    assert decided.status_code == 200 and decided.json()["decided_by"] == "alice"
    assert stack.wait(run_id).status == "succeeded"
    [audit] = stack.rows("SELECT detail FROM audit_events WHERE kind = 'agent.approval.decided'")
    assert audit.detail["by"] == "alice"


def test_a_request_key_with_another_request_is_409(stack, front) -> None:
    first = _hook(front, "ci", "evt-9")
    assert _hook(front, "ci", "evt-9").json() == {**first.json(), "created": False}
    other = _hook(front, "ci", "evt-9", text="something else")
    assert other.status_code == 409
    body = other.json()
    assert body == {"error": body["error"], "run_id": first.json()["run_id"]}  # no digest
    [digest] = [r.request_digest for r in stack.rows("SELECT request_digest FROM runs")]
    assert digest not in other.text
    assert _count(stack, "runs") == 1


def _a2a(front, who: str, method: str, params: dict) -> object:
    body = {"jsonrpc": "2.0", "id": 1, "method": method, "params": params}
    return front.post("/a2a", json=body, headers={**_bearer(who), "A2A-Version": "1.0"})


def test_a2a_methods_that_start_or_cancel_need_their_rights(stack, front) -> None:
    message = {
        "message": {
            "messageId": str(uuid.uuid4()),
            "role": "ROLE_USER",
            "parts": [{"text": "read T-7"}],
            "metadata": {"skill": "reader"},
        },
        "configuration": {"returnImmediately": True},
    }
    refused = _a2a(front, "viewer", "SendMessage", message)
    assert refused.status_code == 403 and refused.json()["right"] == "start"
    assert _count(stack, "runs") == 0
    sent = _a2a(front, "ci", "SendMessage", message)
    assert sent.status_code == 200, sent.text
    task_id = sent.json()["result"]["task"]["id"]
    read = _a2a(front, "ci", "GetTask", {"id": task_id})  # reading needs no right
    assert read.status_code == 200 and read.json()["result"]["id"] == task_id
    not_allowed = _a2a(front, "alice", "CancelTask", {"id": task_id})
    assert not_allowed.status_code == 403 and not_allowed.json()["right"] == "stop"
    canceled = _a2a(front, "ci", "CancelTask", {"id": task_id})
    assert canceled.status_code == 200, canceled.text
    reason = stack.client.get(stack.rows("SELECT id FROM runs")[0].id).failure_reason
    assert "stopped by ci" in reason  # the token's principal, not a name in the request
