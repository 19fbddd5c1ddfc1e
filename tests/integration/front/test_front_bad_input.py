"""Bad input at the real front (`python -m front`): JSON nested past any use is refused as
malformed (400, or the JSON-RPC parse error at /a2a) with no traceback; A2A messages are
bounded and checked whole (metadata too) before anything is stored; and no refused value
reaches the front's log."""

from __future__ import annotations

import json
import uuid
from typing import Any

import httpx
import pytest

from liyagent.local.botframework import BotChannel
from tests.support.catalogs import helper_agent
from tests.support.front import AUTH, serve_front

# A value every request below carries somewhere it is refused: it must never reach the log.
MARK = "SECRET-7f3a"
DEEP = 100_000
RUN = str(uuid.uuid4())
# Every JSON endpoint of the front but /a2a and /api/messages, with a valid body.
JSON_ENDPOINTS = {
    "/webhooks/helper": {"event_id": "e", "input": "x"},
    "/tickets/T-1/events": {"event_id": "e", "agent": "helper", "type": "note", "text": "x"},
    "/copilot/turns": {
        "conversation": "c",
        "turn_id": "t",
        "agent": "helper",
        "text": "x",
        "user": "u",
    },
    f"/approvals/{RUN}/decision": {"approve": True},
    f"/runs/{RUN}/stop": {"reason": "r"},
    f"/runs/{RUN}/stop/lift": {},
    "/agents/helper/stop": {"reason": "r"},
    "/agents/helper/stop/lift": {},
    f"/runs/{RUN}/erase": {},
    "/owners/ann/erase": {},
}
COUNTED = ("runs", "a2a_tasks", "teams_inbox", "stops")


@pytest.fixture
def channel(stack):
    with BotChannel() as bot:
        yield bot


@pytest.fixture
def front(stack, tmp_path, channel):
    path = tmp_path / "agents.json"
    path.write_text(json.dumps({"agents": {"helper": helper_agent(stack.sim_url)}}))
    url = serve_front(stack, str(path), channel.env("helper"))
    with httpx.Client(base_url=url, headers=AUTH, timeout=30) as http:
        yield http


def _counts(stack) -> dict[str, int]:
    return {t: stack.rows(f"SELECT count(*) AS n FROM {t}")[0].n for t in COUNTED}


def _log(stack) -> str:
    [front] = [p for p in stack.procs if p.name == "front"]
    return front.output()


def _post(front: httpx.Client, path: str, raw: bytes, **headers: str) -> httpx.Response:
    return front.post(path, content=raw, headers={"Content-Type": "application/json", **headers})


def _rpc(front: httpx.Client, raw: bytes) -> dict[str, Any]:
    answer = _post(front, "/a2a", raw, **{"A2A-Version": "1.0"})
    assert answer.status_code == 200, answer.text
    body: dict[str, Any] = answer.json()
    return body


def _send(message: dict[str, Any], **params: Any) -> bytes:
    message = {"messageId": "m-1", "role": "ROLE_USER", "parts": [{"text": "hi"}], **message}
    body = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "SendMessage",
        "params": {"message": message, "configuration": {"returnImmediately": True}, **params},
    }
    return json.dumps(body).encode()


def _assert_clean(log: str) -> None:
    for bad in ("Traceback", "RecursionError", "front.failed", "front.a2a_failed", MARK):
        assert bad not in log, (bad, log[-3000:])


def test_deep_json_is_refused_as_malformed_at_every_endpoint(stack, front, channel) -> None:
    before = _counts(stack)
    deep_bodies = [
        b"[" * DEEP,
        b"[" * DEEP + b"]" * DEEP,
        b'{"event_id": "e", "input": ' + b'{"a": ' * DEEP,
        json.dumps({"input": json.loads("[" * 200 + "]" * 200)}).encode(),
    ]
    for path in JSON_ENDPOINTS:
        for raw in deep_bodies:
            answer = _post(front, path, raw)
            assert answer.status_code == 400, (path, raw[:40], answer.text)
            assert "nested" in answer.json()["error"], answer.text
    head = b'{"jsonrpc": "2.0", "id": 1, "method": "SendMessage", "params": '
    for raw in (head + b"[" * DEEP, head + b'{"a": ' * DEEP + b"1" + b"}" * DEEP + b"}"):
        error = _rpc(front, raw)["error"]
        assert error["code"] == -32700 and "nested" in error["message"], error
    deep_metadata = _send({"metadata": {"skill": "helper", "x": json.loads("[" * 200 + "]" * 200)}})
    assert _rpc(front, deep_metadata)["error"]["code"] == -32700
    activity = channel.activity(conversation="a:1", text="hi", service_url=stack.sim_url)
    token = channel.token(stack.sim_url)
    deep_activity = json.dumps(activity).encode()[:-1] + b', "x": ' + b"[" * DEEP + b"}"
    answer = _post(front, "/api/messages", deep_activity, Authorization=f"Bearer {token}")
    assert answer.status_code == 400 and "nested" in answer.json()["error"], answer.text
    assert _counts(stack) == before
    assert front.get("/healthz").status_code == 200
    _assert_clean(_log(stack))


def test_a2a_messages_are_checked_whole_before_anything_is_stored(stack, front) -> None:
    before = _counts(stack)
    nul = f"{MARK}\x00"
    refused = [
        {"metadata": {"skill": "helper", "note": nul}},
        {"metadata": {"skill": "helper", nul: "key"}},
        {"metadata": {"skill": "helper", "note": f"{MARK}" + "x" * (64 * 1024)}},
        {"metadata": {"skill": "helper", **{f"k{i}": f"{MARK}" + "x" * 1000 for i in range(20)}}},
        {"metadata": {"skill": "helper"}, "parts": [{"text": "hi", "metadata": {"n": nul}}]},
        {"metadata": {"skill": "helper"}, "contextId": nul},
        {"metadata": {"skill": "helper"}, "extensions": [nul]},
        {"metadata": {"skill": "helper"}, "referenceTaskIds": [nul]},
        {"metadata": {"skill": "helper"}, "parts": [{"text": "hi"}, {"url": f"http://{nul}"}]},
        {"metadata": {"skill": "helper"}, "parts": [{"text": "hi"}, {"data": {"n": [nul]}}]},
        {"metadata": {"skill": "helper"}, "parts": [{"text": "hi"}, {"raw": "eHh4" * 30_000}]},
    ]
    for message in refused:
        error = _rpc(front, _send(message))["error"]
        assert error["code"] == -32602, (message, error)
    lone = _send({"metadata": {"skill": "helper", "note": "\ud800"}}).replace(
        b"\\ud800", f"{MARK}\\ud800".encode()
    )
    assert _rpc(front, lone)["error"]["code"] in (-32602, -32700)
    error = _rpc(front, _send({}, metadata={"skill": nul}))["error"]
    assert error["code"] == -32602, error
    assert _counts(stack) == before
    # The same message with clean metadata is taken.
    ok = _rpc(front, _send({"metadata": {"skill": "helper", "note": "fine\ttext"}}))
    assert ok["result"]["task"]["id"] == "m-1", ok
    _assert_clean(_log(stack))


def test_refused_values_never_reach_the_log(stack, front, channel) -> None:
    before = _counts(stack)
    refusals = [
        ("/webhooks/helper", {"event_id": f"{MARK} x", "input": "x"}, 400),
        ("/webhooks/helper", {"event_id": "e", "input": f"{MARK}\x00"}, 400),
        ("/webhooks/helper", {"event_id": "e", "input": "x", MARK: 1}, 400),
        (f"/webhooks/{MARK}%20x", {"event_id": "e", "input": "x"}, 400),
        (f"/webhooks/{MARK}", {"event_id": "e", "input": "x"}, 404),
        (f"/tickets/{MARK}:1/events", JSON_ENDPOINTS["/tickets/T-1/events"], 400),
        ("/copilot/turns", {**JSON_ENDPOINTS["/copilot/turns"], "user": f"{MARK}\n"}, 400),
        (f"/runs/{MARK}/stop", {"reason": "r"}, 400),
        (f"/owners/{MARK}/erase", {}, 404),
        ("/webhooks/helper", f'{{"event_id": "e", "input": "{MARK}'.encode(), 400),
    ]
    for path, body, status in refusals:
        raw = body if isinstance(body, bytes) else json.dumps(body).encode()
        answer = _post(front, path, raw)
        assert answer.status_code == status, (path, answer.text)
    events = front.get(f"/runs/{RUN}/events", headers={"Last-Event-ID": MARK})
    assert events.status_code in (400, 404)
    for raw in (
        _send({"metadata": {"skill": MARK}}),
        _send({"metadata": {"skill": "helper"}, "parts": MARK}),
        _send({"messageId": f"{MARK} x", "metadata": {"skill": "helper"}}),
        json.dumps({"jsonrpc": "2.0", "id": MARK, "method": MARK}).encode(),
        json.dumps({"jsonrpc": "2.0", "id": MARK, "method": "GetTask", "params": MARK}).encode(),
        json.dumps({"jsonrpc": "1.0", "id": MARK, "method": "GetTask"}).encode(),
        f'{{"jsonrpc": "2.0", "id": "{MARK}'.encode(),
    ):
        assert "error" in _rpc(front, raw)
    activity = channel.activity(conversation="a:1", text="hi", service_url=stack.sim_url)
    token = {"Authorization": f"Bearer {channel.token(stack.sim_url)}"}
    for spoiled in ({"type": MARK}, {"channelId": MARK}, {"text": f"{MARK}\x00"}):
        raw = json.dumps({**activity, **spoiled}).encode()
        assert _post(front, "/api/messages", raw, **token).status_code in (200, 400, 401)
    assert _counts(stack) == before
    _assert_clean(_log(stack))
