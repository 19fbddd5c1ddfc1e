"""The HTTP front: auth, every endpoint's happy path and idempotent repeats, runs carried to
their answers by real workers, bad requests refused with nothing stored, and the real server
started as a process."""

from __future__ import annotations

import json
import uuid
import warnings
from dataclasses import replace

import httpx
import pytest
from starlette.exceptions import StarletteDeprecationWarning

from front.app import create_app
from liyagent.local.procs import Proc, python
from runtime import services as runtime_services
from runtime.base.settings import Settings
from tests.support.scripts import call, final, step

# Starlette 1.x prefers httpx2 for its test client and warns once when it falls back to httpx
# (which it still fully supports); until httpx2 is a dev dependency, that warning is expected.
with warnings.catch_warnings():
    warnings.simplefilter("ignore", StarletteDeprecationWarning)
    from starlette.testclient import TestClient

TOKEN = "t0k"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
ANSWER = "Ticket T-7 is about checkout errors."


def _agent(tool: str, last: str, **args: str) -> dict[str, object]:
    """A catalog agent whose scripted model makes one call, then answers `last`."""
    steps = [step(call(f"toolu_{tool}", tool, **args)), final(last)]
    return {"tools": [tool], "model": {"provider": "scripted", "script": {"steps": steps}}}


READER = _agent("ticket.read", ANSWER, ticket="T-7")
PAGER = _agent("incident.page", "Paged.", title="Checkout down", severity="sev1")
COUNTED = ("runs", "teams_inbox", "a2a_tasks", "stops", "approvals")


@pytest.fixture
def agents_file(tmp_path) -> str:
    path = tmp_path / "front-agents.json"
    path.write_text(json.dumps({"agents": {"reader": READER, "pager": PAGER}}))
    return str(path)


def _services(stack, agents_file: str, token: str = TOKEN):
    settings = replace(stack.settings, agents_file=agents_file, front_token=token)
    return runtime_services.build(settings, stack.services.publisher, sealer=stack.sealer)


@pytest.fixture
def front(stack, agents_file):
    services = _services(stack, agents_file)
    with TestClient(create_app(services), headers=AUTH) as client:
        yield client
    services.redis.close()


def _worker(stack, agents_file: str, name: str = "w1"):
    return stack.worker(name, env={"LIYAGENT_AGENTS_FILE": agents_file})


def _counts(stack) -> dict[str, int]:
    return {t: stack.rows(f"SELECT count(*) AS n FROM {t}")[0].n for t in COUNTED}


def _webhook(front, event_id: str = "e1", agent: str = "reader", **kwargs):
    return front.post(
        f"/webhooks/{agent}", json={"event_id": event_id, "input": "read T-7"}, **kwargs
    )


def _assistant(stack, run_id: str) -> list[str]:
    return [text for role, text in stack.client.transcript(run_id) if role == "assistant"]


def test_auth_refuses_missing_and_wrong_tokens_and_an_unset_one(stack, agents_file) -> None:
    services = _services(stack, agents_file)
    with TestClient(create_app(services)) as client:
        assert client.get("/healthz").json() == {"ok": True}
        missing = _webhook(client)
        assert missing.status_code == 401
        assert missing.headers["www-authenticate"].startswith("Bearer")
        assert "LIYAGENT_FRONT_TOKEN" in missing.json()["error"]
        for header in ("Bearer nope", f"Basic {TOKEN}", f"Bearer {TOKEN}x", "Bearer", "t0k"):
            refused = _webhook(client, headers={"Authorization": header})
            assert refused.status_code == 401, header
        assert client.get(f"/runs/{uuid.uuid4()}").status_code == 401
        assert _counts(stack)["runs"] == 0
        assert _webhook(client, headers=AUTH).status_code == 202
    unset = _services(stack, agents_file, token="")
    with TestClient(create_app(unset)) as client:
        refused = _webhook(client, event_id="e2", headers={"Authorization": "Bearer "})
        assert refused.status_code == 503
        assert "LIYAGENT_FRONT_TOKEN" in refused.json()["error"]
        assert _webhook(client, event_id="e2", headers=AUTH).status_code == 503
        assert client.get("/healthz").status_code == 200
    assert _counts(stack)["runs"] == 1
    services.redis.close()
    unset.redis.close()


# A run that has used nothing yet, as the front answers it (store/usage.py `to_json`).
NONE_USED = {
    "input_tokens": 0,
    "output_tokens": 0,
    "cached_tokens": 0,
    "unconfirmed_input_tokens": 0,
    "unconfirmed_output_tokens": 0,
    "cost_usd": "0",
    "unconfirmed_cost_usd": "0",
    "unpriced": 0,
}


def test_webhook_is_one_run_per_event_and_reads_back(stack, front) -> None:
    first = _webhook(front, "evt-1")
    again = _webhook(front, "evt-1")
    assert (first.status_code, again.status_code) == (202, 202)
    run_id = first.json()["run_id"]
    assert first.json() == {"run_id": run_id, "created": True}
    assert again.json() == {"run_id": run_id, "created": False}
    rows = stack.rows(
        "SELECT id, entry_kind, owner, channel, agent FROM runs WHERE request_key = :k",
        k="webhook:reader:evt-1",
    )
    assert [(r.id, r.entry_kind, r.owner, r.channel, r.agent) for r in rows] == [
        (run_id, "webhook", "webhook", "webhook", "reader")
    ]
    view = front.get(f"/runs/{run_id}")
    assert view.status_code == 200
    assert view.json() == {
        "id": run_id,
        "status": "queued",
        "attempt": 1,
        "lost_count": 0,
        "step": 0,
        "answer": None,
        "failure_reason": None,
        "waiting_on": None,
        "answer_error": None,
        "output": None,
        "waiting_for": None,
        "tenant": "webhook",
        "priority": 2,
        "usage": {**NONE_USED, "with_children": NONE_USED},
    }
    unknown = _webhook(front, "evt-2", agent="ghost")
    assert unknown.status_code == 404 and "no agent named 'ghost'" in unknown.json()["error"]
    missing = front.get(f"/runs/{uuid.uuid4()}")
    assert missing.status_code == 404 and "does not exist" in missing.json()["error"]
    assert _counts(stack)["runs"] == 1


def test_ticket_events_and_copilot_turns_start_keyed_runs(stack, front) -> None:
    event = {"event_id": "ev-9", "agent": "reader", "type": "comment", "text": "still broken"}
    ticket = front.post("/tickets/T-7/events", json=event)
    assert ticket.status_code == 202 and ticket.json()["created"] is True
    assert front.post("/tickets/T-7/events", json=event).json() == {
        "run_id": ticket.json()["run_id"],
        "created": False,
    }
    turn = {"conversation": "c-1", "turn_id": "t-1", "agent": "reader", "text": "hi", "user": "ann"}
    copilot = front.post("/copilot/turns", json=turn)
    assert copilot.status_code == 202 and copilot.json()["created"] is True
    assert front.post("/copilot/turns", json=turn).json()["run_id"] == copilot.json()["run_id"]
    rows = stack.rows(
        "SELECT r.id, r.request_key, r.entry_kind, r.owner, r.channel, r.input AS content "
        "FROM runs r ORDER BY r.created_at"
    )
    assert [(r.id, r.request_key, r.entry_kind, r.owner, r.channel) for r in rows] == [
        (ticket.json()["run_id"], "ticket:T-7:ev-9", "ticket_event", "tickets", "tickets"),
        (copilot.json()["run_id"], "copilot:c-1:t-1", "copilot", "ann", "copilot"),
    ]
    assert "comment" in rows[0].content and "still broken" in rows[0].content
    assert rows[1].content == "hi"


def _rpc(front, method: str, params: dict[str, object]) -> dict[str, object]:
    """One A2A JSON-RPC call (the SDK's own client is exercised in test_a2a.py)."""
    body = {"jsonrpc": "2.0", "id": 1, "method": method, "params": params}
    answer = front.post("/a2a", json=body, headers={"A2A-Version": "1.0"})
    assert answer.status_code == 200, answer.text
    result: dict[str, object] = answer.json()["result"]
    return result


def _send_task(front, message_id: str, skill: str, text: str) -> dict[str, object]:
    message = {
        "messageId": message_id,
        "role": "ROLE_USER",
        "parts": [{"text": text}],
        "metadata": {"skill": skill},
    }
    params = {"message": message, "configuration": {"returnImmediately": True}}
    return _rpc(front, "SendMessage", params)["task"]  # type: ignore[return-value]


def test_webhook_and_a2a_runs_reach_their_answers_on_a_worker(stack, front, agents_file) -> None:
    hook = _webhook(front, "evt-w").json()["run_id"]
    task = _send_task(front, "task-1", "reader", "read T-7")
    assert task["status"]["state"] == "TASK_STATE_SUBMITTED"  # type: ignore[index]
    assert _send_task(front, "task-1", "reader", "read T-7")["id"] == "task-1"
    assert _counts(stack)["runs"] == 2 and _counts(stack)["a2a_tasks"] == 1
    _worker(stack, agents_file)
    run_id = task["metadata"]["run_id"]  # type: ignore[index]
    for run in (hook, run_id):
        assert stack.wait(run).status == "succeeded", run
        assert _assistant(stack, run) == [ANSWER]
    view = front.get(f"/runs/{hook}").json()
    assert (view["status"], view["answer"]) == ("succeeded", ANSWER)
    done = _rpc(front, "GetTask", {"id": "task-1"})
    assert done["status"]["state"] == "TASK_STATE_COMPLETED"  # type: ignore[index]
    assert done["artifacts"][0]["parts"] == [{"text": ANSWER}]  # type: ignore[index]


def test_approval_decisions_are_made_once(stack, front, agents_file) -> None:
    _worker(stack, agents_file)
    task = _send_task(front, "page-1", "pager", "page")
    run_id = task["metadata"]["run_id"]  # type: ignore[index]
    view = stack.client.wait(run_id, timeout_s=60, until=frozenset({"waiting"}))
    [approval] = stack.client.approvals(run_id)
    assert view.waiting_on == f"approval:{approval.id}"
    assert front.get(f"/runs/{run_id}").json()["waiting_on"] == view.waiting_on
    path = f"/approvals/{approval.id}/decision"
    decided = front.post(path, json={"approve": True, "reason": None})
    assert decided.status_code == 200
    assert decided.json() == {
        "id": approval.id,
        "status": "approved",
        "decided_by": "front-token",
        "run_id": run_id,
    }
    again = front.post(path, json={"approve": False})
    assert again.status_code == 409
    assert again.json()["run_id"] == run_id and "already approved" in again.json()["error"]
    unknown = front.post(f"/approvals/{uuid.uuid4()}/decision", json={"approve": True})
    assert unknown.status_code == 404 and "does not exist" in unknown.json()["error"]
    assert stack.wait(run_id).status == "succeeded"
    done = _rpc(front, "GetTask", {"id": "page-1"})
    assert done["artifacts"][0]["parts"] == [{"text": "Paged."}]  # type: ignore[index]
    assert [a.status for a in stack.client.approvals(run_id)] == ["approved"]


def test_stop_fails_a_queued_run_now(stack, front) -> None:
    run_id = _webhook(front, "evt-s").json()["run_id"]
    stopped = front.post(f"/runs/{run_id}/stop", json={"reason": "wrong input"})
    assert stopped.status_code == 202
    assert stopped.json() == {"run_id": run_id, "stopped_now": True, "by": "front-token"}
    view = front.get(f"/runs/{run_id}").json()
    assert view["status"] == "failed" and "wrong input" in view["failure_reason"]
    unknown = front.post(f"/runs/{uuid.uuid4()}/stop", json={"reason": "x"})
    assert unknown.status_code == 404
    assert _counts(stack)["stops"] == 1


def test_a_signal_through_the_front_is_stored_once_per_key(stack, front) -> None:
    run_id = _webhook(front, "evt-sig").json()["run_id"]  # no worker: it stays queued
    body = {"name": "customer-reply", "payload": {"text": "yes"}, "key": "reply-1"}
    sent = front.post(f"/runs/{run_id}/signal", json=body)
    assert sent.status_code == 202, sent.text
    again = front.post(f"/runs/{run_id}/signal", json=body)
    assert again.json()["signal_id"] == sent.json()["signal_id"]
    rows = stack.rows("SELECT name, payload, sent_by FROM signals WHERE run_id = :r", r=run_id)
    assert [(r.name, r.payload, r.sent_by) for r in rows] == [
        ("customer-reply", {"text": "yes"}, "front-token")
    ]
    assert front.post(f"/runs/{uuid.uuid4()}/signal", json=body).status_code == 404
    bad = front.post(f"/runs/{run_id}/signal", json={**body, "name": "two words"})
    assert bad.status_code == 400 and "a name is" in bad.text
    front.post(f"/runs/{run_id}/stop", json={"reason": "done"})
    ended = front.post(f"/runs/{run_id}/signal", json={**body, "key": "reply-2"})
    assert ended.status_code == 400 and "has ended" in ended.text


RUN = str(uuid.uuid4())
DECIDE, STOP = f"/approvals/{RUN}/decision", f"/runs/{RUN}/stop"
HOOK, TICKET = "/webhooks/reader", "/tickets/T-1/events"
GOOD = {
    HOOK: {"event_id": "e", "input": "x"},
    TICKET: {"event_id": "e", "agent": "reader", "type": "note", "text": "x"},
    "/copilot/turns": {
        "conversation": "c",
        "turn_id": "t",
        "agent": "reader",
        "text": "x",
        "user": "u",
    },
    DECIDE: {"approve": True, "reason": "ok"},
    STOP: {"reason": "r"},
}
OPTIONAL = {DECIDE: {"reason"}}
Case = tuple[str, str, dict[str, object], int]


def _with(path: str, **changes: object) -> dict[str, object]:
    return {**GOOD[path], **changes}


def _bad_bodies() -> list[Case]:
    """Every endpoint with a body: each field missing, of a wrong type, empty; and more."""
    cases: list[tuple[str, object]] = []
    for path, body in GOOD.items():
        for field in body:
            if field not in OPTIONAL.get(path, set()):
                cases.append((path, {k: v for k, v in body.items() if k != field}))
            cases += [(path, _with(path, **{field: bad})) for bad in (12, ["x"], {"a": 1})]
            if field != "approve":
                cases += [(path, _with(path, **{field: bad})) for bad in ("", "   ")]
        cases += [(path, _with(path, extra="x")), (path, [body]), (path, "text"), (path, 7)]
    return [("POST", path, {"json": body}, 400) for path, body in cases]


def _bad_raw_bodies() -> list[Case]:
    """Bodies that are not JSON objects at all, too big, or not JSON."""
    raw: list[tuple[object, int]] = [
        (b'{"event_id": "e", "input": "\\ud800"}', 400),
        (b'{"event_id": "e", "input": ', 400),
        (b'{"event_id": "e", "input": NaN}', 400),
        (b"\xff\xfe", 400),
        (b"", 400),
        (b"null", 400),
        (b"[" * 100_000, 400),  # past Python's recursion limit
        (iter([b'{"input": "'] + [b"x" * 65536] * 17), 413),  # chunked: no Content-Length
    ]
    return [
        *[("POST", HOOK, {"content": body}, status) for body, status in raw],
        ("POST", HOOK, {"content": b"event_id=e", "ctype": "text/plain"}, 415),
        ("POST", HOOK, {"json": {"event_id": "e", "input": "x" * (1 << 20)}}, 413),
    ]


def _bad_values() -> list[Case]:
    """Malformed ids in paths and bodies, oversize or multi-line text, unknown agents."""
    values: list[tuple[str, dict[str, object], int]] = [
        (HOOK, _with(HOOK, event_id="bad id"), 400),
        (HOOK, _with(HOOK, event_id="e" * 201), 400),
        (HOOK, _with(HOOK, input="x" * (64 * 1024 + 1)), 400),
        (HOOK, _with(HOOK, input="nul\x00here"), 400),
        ("/copilot/turns", _with("/copilot/turns", user="two\nlines"), 400),
        ("/copilot/turns", _with("/copilot/turns", agent="ghost"), 404),
        (TICKET, _with(TICKET, agent="ghost"), 404),
        (DECIDE, _with(DECIDE, approve="yes"), 400),
        (DECIDE, _with(DECIDE, approve=1), 400),
        (STOP, _with(STOP, reason="r" * 5000), 400),
        ("/webhooks/read%20er", GOOD[HOOK], 400),
        ("/webhooks/a:b", GOOD[HOOK], 400),
        ("/tickets/T%201/events", GOOD[TICKET], 400),
        ("/tickets/T:1/events", GOOD[TICKET], 400),
        ("/approvals/not-a-uuid/decision", GOOD[DECIDE], 400),
        ("/runs/not-a-uuid/stop", GOOD[STOP], 400),
    ]
    return [("POST", path, {"json": body}, status) for path, body, status in values]


def _bad_routes() -> list[Case]:
    return [
        ("GET", "/runs/not-a-uuid", {}, 400),
        ("POST", "/a2a/tasks", {"json": {}}, 404),
        ("POST", "/teams/messages", {"json": {}}, 404),
        ("GET", "/a2a", {}, 405),
        ("GET", "/nowhere", {}, 404),
        ("GET", HOOK, {}, 405),
        ("DELETE", f"/runs/{RUN}", {}, 405),
        ("POST", "/healthz", {"json": {}}, 405),
    ]


def _send(front, case: Case):
    method, path, args, _ = case
    args, headers = dict(args), dict(AUTH)
    if "content" in args:
        headers["Content-Type"] = str(args.pop("ctype", "application/json"))
    return front.request(method, path, headers=headers, **args)


def test_bad_requests_at_every_endpoint_store_nothing(stack, front) -> None:
    before = _counts(stack)
    cases = _bad_bodies() + _bad_raw_bodies() + _bad_values() + _bad_routes()
    assert len(cases) > 120
    for case in cases:
        answer = _send(front, case)
        assert answer.status_code == case[3], (case, answer.text)
        assert answer.json()["error"], case
        if case[3] == 405:
            assert answer.headers["allow"]
    assert _counts(stack) == before
    # The bodies every case above spoils are valid: sent as they are, they pass validation.
    for path, body in GOOD.items():
        status = 404 if RUN in path else 202
        assert front.post(path, json=body).status_code == status, path


def test_health_names_what_is_down(stack, agents_file) -> None:
    settings = Settings(
        database_url="postgresql+psycopg://postgres@127.0.0.1:1/nothing",
        redis_url="redis://127.0.0.1:1/0",
        agents_file=agents_file,
        front_token=TOKEN,
    )
    services = runtime_services.build(settings, stack.services.publisher, sealer=stack.sealer)
    with TestClient(create_app(services)) as client:
        answer = client.get("/healthz")
    assert answer.status_code == 503
    assert "postgres" in answer.json()["error"] and "redis" in answer.json()["error"]
    services.redis.close()
    services.engine.dispose()


def test_the_real_server_runs_a_webhook_end_to_end(stack, agents_file, tmp_path) -> None:
    env = {**stack.env, "LIYAGENT_FRONT_TOKEN": TOKEN, "LIYAGENT_AGENTS_FILE": agents_file}
    server = Proc("front", python("-m", "front", "--port", "0"), env, tmp_path / "front.log")
    try:
        url = server.wait_for(r"front listening on (http://\S+)", timeout=30).group(1)
        _worker(stack, agents_file)
        with httpx.Client(base_url=url, headers=AUTH, timeout=10) as http:
            assert http.get("/healthz").json() == {"ok": True}
            assert http.post("/webhooks/reader", json={"event_id": "e"}).status_code == 400
            started = http.post("/webhooks/reader", json={"event_id": "e", "input": "read T-7"})
            assert started.status_code == 202, started.text
            run_id = started.json()["run_id"]
            assert stack.wait(run_id).status == "succeeded"
            assert http.get(f"/runs/{run_id}").json()["answer"] == ANSWER
        assert stack.client.transcript(run_id) == [("user", "read T-7"), ("assistant", ANSWER)]
        assert server.alive()
    finally:
        server.kill()
