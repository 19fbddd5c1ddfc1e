"""A2A 1.0 (JSON-RPC binding) through a real `python -m front`, driven by the A2A SDK's own
client: the agent card, a task completed by a real worker, a worker SIGKILLed while the task is
working (the artifact delivered once), a run lost past the limit reported failed, CancelTask,
and bad requests answered with JSON-RPC errors or 401, never a traceback."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import httpx
import pytest
from a2a.client import Client, ClientConfig, ClientFactory
from a2a.client.errors import A2AClientError
from a2a.types import (
    CancelTaskRequest,
    GetTaskRequest,
    ListTasksRequest,
    Message,
    Part,
    Role,
    SendMessageRequest,
    Task,
    TaskNotCancelableError,
    TaskNotFoundError,
    TaskState,
)

from tests.support.catalogs import helper_agent
from tests.support.front import AUTH, TOKEN, serve_front
from tests.support.scripts import call, final, step
from tests.support.stack import sim_model

pytestmark = pytest.mark.kill
ANSWER = "Answer from helper."
R = TypeVar("R")


@pytest.fixture
def agents_file(stack, tmp_path) -> str:
    pager = [step(call("toolu_page", "incident.page", title="Checkout down")), final("Paged.")]
    agents = {
        "helper": helper_agent(stack.sim_url),
        "pager": {"tools": ["incident.page"], "model": sim_model(stack.sim_url, pager)},
    }
    path = tmp_path / "a2a-agents.json"
    path.write_text(json.dumps({"agents": agents}))
    return str(path)


@pytest.fixture
def front(stack, agents_file) -> str:
    return serve_front(stack, agents_file)


def _worker(stack, agents_file: str, name: str = "w1", **kwargs: Any):
    return stack.worker(name, env={"LIYAGENT_AGENTS_FILE": agents_file}, **kwargs)


def sdk(url: str, work: Callable[[Client], Awaitable[R]], token: str = TOKEN) -> R:
    """Run `work` with the SDK's client, made from the card the front serves."""

    async def main() -> R:
        headers = {"Authorization": f"Bearer {token}"}
        async with httpx.AsyncClient(headers=headers, timeout=60) as http:
            config = ClientConfig(httpx_client=http, streaming=False)
            client = await ClientFactory(config).create_from_url(url)
            return await work(client)

    return asyncio.run(main())


def request(
    text: str = "look at T-3",
    skill: str | None = "helper",
    message_id: str | None = None,
    now: bool = True,
) -> SendMessageRequest:
    message = Message(
        message_id=message_id or str(uuid.uuid4()), role=Role.ROLE_USER, parts=[Part(text=text)]
    )
    if skill is not None:
        message.metadata.update({"skill": skill})
    sent = SendMessageRequest(message=message)
    sent.configuration.return_immediately = now
    return sent


async def send(client: Client, sent: SendMessageRequest) -> Task:
    async for event in client.send_message(sent):
        assert event.HasField("task"), event
        return event.task
    raise AssertionError("SendMessage answered nothing")


def get(url: str, task_id: str) -> Task:
    return sdk(url, lambda c: c.get_task(GetTaskRequest(id=task_id)))


def wait_state(url: str, task_id: str, states: set[int], timeout: float = 60) -> Task:
    deadline = time.monotonic() + timeout
    while True:
        task = get(url, task_id)
        if task.status.state in states:
            return task
        assert time.monotonic() < deadline, f"task {task_id} still {task.status.state}"
        time.sleep(0.2)


def answer_of(task: Task) -> list[str]:
    return [p.text for a in task.artifacts for p in a.parts]


def run_of(task: Task) -> str:
    return str(dict(task.metadata)["run_id"])


DONE = {TaskState.TASK_STATE_COMPLETED, TaskState.TASK_STATE_FAILED, TaskState.TASK_STATE_CANCELED}


def test_the_card_lists_each_agent_as_a_skill_behind_the_bearer_scheme(front) -> None:
    card = httpx.get(f"{front}/.well-known/agent-card.json", timeout=10)
    assert card.status_code == 200
    body = card.json()
    assert [s["id"] for s in body["skills"]] == ["helper", "pager"]
    assert body["supportedInterfaces"] == [
        {"url": f"{front}/a2a", "protocolBinding": "JSONRPC", "protocolVersion": "1.0"}
    ]
    assert body["securitySchemes"]["bearer"]["httpAuthSecurityScheme"]["scheme"] == "Bearer"
    assert body["securityRequirements"] == [{"schemes": {"bearer": {}}}]
    assert body["capabilities"]["streaming"] is True  # SendStreamingMessage, SubscribeToTask


def test_a_task_completes_and_a_repeated_message_is_the_same_task(stack, front, agents_file):
    message_id = f"msg-{uuid.uuid4().hex}"
    first = sdk(front, lambda c: send(c, request(message_id=message_id)))
    assert first.id == message_id
    assert first.status.state == TaskState.TASK_STATE_SUBMITTED
    assert [p.text for p in first.history[0].parts] == ["look at T-3"]
    again = sdk(front, lambda c: send(c, request(message_id=message_id)))
    assert (again.id, again.context_id) == (first.id, first.context_id)
    assert stack.rows("SELECT count(*) AS n FROM runs")[0].n == 1
    _worker(stack, agents_file)
    done = wait_state(front, first.id, DONE)
    assert done.status.state == TaskState.TASK_STATE_COMPLETED
    assert answer_of(done) == [ANSWER]
    # A SendMessage that may block waits for the task to end.
    blocking = sdk(front, lambda c: send(c, request(now=False)))
    assert blocking.status.state == TaskState.TASK_STATE_COMPLETED
    assert answer_of(blocking) == [ANSWER]
    listed = sdk(front, lambda c: c.list_tasks(ListTasksRequest(include_artifacts=True)))
    assert [t.id for t in listed.tasks] == [blocking.id, first.id]
    assert listed.total_size == 2
    page = sdk(front, lambda c: c.list_tasks(ListTasksRequest(page_size=1)))
    assert [t.id for t in page.tasks] == [blocking.id] and page.next_page_token
    rest = ListTasksRequest(page_size=1, page_token=page.next_page_token)
    assert [t.id for t in sdk(front, lambda c: c.list_tasks(rest)).tasks] == [first.id]
    working = ListTasksRequest(status=TaskState.TASK_STATE_WORKING)
    assert list(sdk(front, lambda c: c.list_tasks(working)).tasks) == []
    ctx = ListTasksRequest(context_id=first.context_id)
    assert [t.id for t in sdk(front, lambda c: c.list_tasks(ctx)).tasks] == [first.id]


def test_a_worker_killed_while_the_task_is_working_delivers_the_artifact_once(
    stack, front, agents_file
) -> None:
    def start() -> str:
        return run_of(sdk(front, lambda c: send(c, request())))

    stack.reconfigure(agents_file=agents_file)
    run_id = stack.kill_then_resume("after_checkpoint:kill", start)
    [task_id] = [r.id for r in stack.rows("SELECT id FROM a2a_tasks")]
    done = wait_state(front, task_id, DONE)
    assert done.status.state == TaskState.TASK_STATE_COMPLETED
    assert answer_of(done) == [ANSWER] and len(done.artifacts) == 1
    assert stack.client.get(run_id).lost_count == 1
    assistant = [t for role, t in stack.client.transcript(run_id) if role == "assistant"]
    assert assistant == [ANSWER]
    assert set(stack.asked(run_id).values()) == {1}  # no written step was asked again


def test_a_run_lost_past_the_limit_is_reported_failed(stack, front, agents_file) -> None:
    stack.reconfigure(agents_file=agents_file)
    stack.worker("ops", runs=False)
    stack.beat()
    task = sdk(front, lambda c: send(c, request()))
    for n in range(3):
        victim = stack.worker(f"victim{n}", fault="after_claim:kill", ops=False)
        stack.fault_hit(f"victim{n}")
        victim.popen.wait(timeout=10)
    failed = wait_state(front, task.id, DONE)
    assert failed.status.state == TaskState.TASK_STATE_FAILED
    said = [p.text for p in failed.status.message.parts]
    assert len(said) == 1 and "lost 3 times" in said[0]
    assert list(failed.artifacts) == []


def test_cancel_task_stops_a_queued_task_and_a_waiting_one(stack, front, agents_file) -> None:
    queued = sdk(front, lambda c: send(c, request()))
    canceled = sdk(front, lambda c: c.cancel_task(CancelTaskRequest(id=queued.id)))
    assert canceled.status.state == TaskState.TASK_STATE_CANCELED
    assert "A2A CancelTask" in canceled.status.message.parts[0].text
    assert get(front, queued.id).status.state == TaskState.TASK_STATE_CANCELED
    with pytest.raises(TaskNotCancelableError):
        sdk(front, lambda c: c.cancel_task(CancelTaskRequest(id=queued.id)))
    view = stack.client.get(run_of(queued))
    assert (
        view.status == "failed" and "stopped by front-token" in view.failure_reason
    )  # the principal
    # A task waiting for a person's approval is auth-required, then canceled by CancelTask.
    _worker(stack, agents_file)
    paged = sdk(front, lambda c: send(c, request("page", skill="pager")))
    waiting = wait_state(front, paged.id, {TaskState.TASK_STATE_AUTH_REQUIRED})
    [approval] = stack.client.approvals(run_of(paged))
    assert f"/approvals/{approval.id}/decision" in waiting.status.message.parts[0].text
    stopped = sdk(front, lambda c: c.cancel_task(CancelTaskRequest(id=paged.id)))
    assert stopped.status.state == TaskState.TASK_STATE_CANCELED
    with pytest.raises(TaskNotFoundError):
        get(front, "no-such-task")


def _rpc(url: str, body: Any, headers: dict[str, str] | None = None, raw: bool = False):
    sent = {**AUTH, "A2A-Version": "1.0", **(headers or {})}
    if raw:
        return httpx.post(f"{url}/a2a", content=body, headers=sent, timeout=10)
    return httpx.post(f"{url}/a2a", json=body, headers=sent, timeout=10)


def _call(method: str, params: Any) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": 7, "method": method, "params": params}


def _msg(**fields: Any) -> dict[str, Any]:
    message = {"messageId": "m-1", "role": "ROLE_USER", "parts": [{"text": "hi"}], **fields}
    return {"message": {k: v for k, v in message.items() if v is not None}}


BAD_RPC: list[tuple[Any, int]] = [
    (b"{not json", -32700),
    (b"[]", -32600),
    (b'"text"', -32600),
    ({"jsonrpc": "1.0", "id": 1, "method": "GetTask", "params": {"id": "x"}}, -32600),
    ({"jsonrpc": "2.0", "id": 1, "params": {}}, -32600),
    (_call("NoSuchMethod", {}), -32601),
    (_call("GetTask", {"id": 5, "historyLength": "many"}), -32602),
    (_call("GetTask", {"id": "no-such-task"}), -32001),
    (_call("CancelTask", {"id": "no-such-task"}), -32001),
    (_call("SendMessage", _msg(parts=[])), -32602),
    (_call("SendMessage", _msg(parts=[{"text": "   "}])), -32602),
    # A lone surrogate, escaped as JSON allows: not Unicode text, refused like any bad text.
    (
        json.dumps(
            _call("SendMessage", _msg(parts=[{"text": "\ud800"}], metadata={"skill": "helper"}))
        ).encode(),
        -32602,
    ),
    (_call("SendMessage", _msg(metadata={"skill": "ghost"})), -32602),
    (_call("SendMessage", _msg()), -32602),  # two skills: the message must name one
    (_call("SendMessage", _msg(messageId="bad id", metadata={"skill": "helper"})), -32602),
    (_call("SendMessage", _msg(messageId=None, metadata={"skill": "helper"})), -32602),
    (_call("SendMessage", _msg(taskId="t-9", metadata={"skill": "helper"})), -32001),
    (_call("SendMessage", _msg(role="ROLE_AGENT", metadata={"skill": "helper"})), -32602),
    # Streams refuse bad input before they open (tests/integration/entries/test_a2a_streaming.py).
    (_call("SendStreamingMessage", _msg(parts=[], metadata={"skill": "helper"})), -32602),
    (_call("SubscribeToTask", {"id": "no-such-task"}), -32001),
    (_call("CreateTaskPushNotificationConfig", {"taskId": "x", "url": "http://x"}), -32003),
    (_call("ListTasks", {"pageSize": 1000}), -32602),
    (_call("ListTasks", {"pageToken": "not-a-token"}), -32602),
]


def test_bad_requests_get_json_rpc_errors_and_store_nothing(stack, front) -> None:
    for body, code in BAD_RPC:
        answer = _rpc(front, body, raw=isinstance(body, bytes))
        assert answer.status_code == 200, (body, answer.text)
        assert answer.json()["error"]["code"] == code, (body, answer.text)
        assert "Traceback" not in answer.text
    old = _rpc(front, _call("GetTask", {"id": "x"}), headers={"A2A-Version": "0.3"})
    assert old.json()["error"]["code"] == -32009  # the version it speaks is named
    assert stack.rows("SELECT count(*) AS n FROM runs")[0].n == 0
    assert stack.rows("SELECT count(*) AS n FROM a2a_tasks")[0].n == 0
    big = _rpc(front, b"{" + b" " * (2 << 20) + b"}", raw=True)
    assert big.status_code == 413


def test_missing_or_wrong_bearer_is_401(stack, front) -> None:
    body = _call("GetTask", {"id": "x"})
    for headers in ({"Authorization": ""}, {"Authorization": "Bearer nope"}):
        answer = _rpc(front, body, headers=headers)
        assert answer.status_code == 401 and answer.headers["www-authenticate"].startswith("Bearer")
    with pytest.raises(A2AClientError, match="401"):
        sdk(front, lambda c: send(c, request()), token="wrong")
    assert stack.rows("SELECT count(*) AS n FROM runs")[0].n == 0
