"""A2A streaming through a real `python -m front`, driven by the A2A SDK's own streaming
client: SendStreamingMessage gives the task, a status update per run event, the answer as an
artifact and the final `completed`; SubscribeToTask on a task whose first stream broke resumes
from the task's current state to its end; and a token without the read right cannot subscribe."""

from __future__ import annotations

import asyncio
import json
import threading
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import replace
from typing import Any, TypeVar

import httpx
import pytest
import sqlalchemy as sa
import uvicorn
from a2a.client import Client, ClientConfig, ClientFactory
from a2a.types import (
    Message,
    Part,
    Role,
    SendMessageRequest,
    StreamResponse,
    SubscribeToTaskRequest,
    TaskState,
)
from google.protobuf.json_format import MessageToDict

from front.app import create_app
from front.auth import token_digest
from runtime import services as runtime_services
from runtime.ops.events import RECHECK_S, read_events
from tests.support.catalogs import helper_agent
from tests.support.front import TOKEN, serve_front

ANSWER = "Answer from helper."
# Less than a follower's re-check interval (runtime.ops.events.RECHECK_S, 1 s), more than a
# read takes: how long a test holds a stream open after its first item before counting reads.
SETTLE_S = 0.3
R = TypeVar("R")
STARTER = "token-of-ci"  # the start right only
TOKENS = json.dumps(
    {"tokens": [{"principal": "ci", "sha256": token_digest(STARTER), "rights": ["start"]}]}
)


@pytest.fixture
def agents_file(stack, tmp_path) -> str:
    path = tmp_path / "a2a-agents.json"
    path.write_text(json.dumps({"agents": {"helper": helper_agent(stack.sim_url)}}))
    stack.reconfigure(agents_file=str(path))
    return str(path)


@pytest.fixture
def front(stack, agents_file) -> str:
    return serve_front(stack, agents_file, {"LIYAGENT_FRONT_TOKENS": TOKENS})


def streaming(url: str, work: Callable[[Client], Awaitable[R]], token: str = TOKEN) -> R:
    """Run `work` with the SDK's streaming client, made from the card the front serves."""

    async def main() -> R:
        headers = {"Authorization": f"Bearer {token}"}
        async with httpx.AsyncClient(headers=headers, timeout=60) as http:
            config = ClientConfig(httpx_client=http, streaming=True)
            client = await ClientFactory(config).create_from_url(url)
            return await work(client)

    return asyncio.run(main())


def message(message_id: str | None = None) -> SendMessageRequest:
    sent = Message(
        message_id=message_id or str(uuid.uuid4()), role=Role.ROLE_USER, parts=[Part(text="T-3")]
    )
    sent.metadata.update({"skill": "helper"})
    return SendMessageRequest(message=sent)


async def collect(stream: Any, limit: int | None = None) -> list[StreamResponse]:
    got: list[StreamResponse] = []
    async for item in stream:
        got.append(item)
        if limit is not None and len(got) >= limit:
            break
    return got


def _event_kinds(items: list[StreamResponse]) -> list[str]:
    return [
        str(MessageToDict(i.status_update.metadata)["event"]["kind"])
        for i in items
        if i.HasField("status_update")
    ]


@pytest.mark.timeout(90)
def test_streaming_send_gives_status_updates_ending_completed(stack, front) -> None:
    stack.worker()
    items = streaming(front, lambda c: collect(c.send_message(message())))
    assert items[0].HasField("task")
    task = items[0].task
    assert task.status.state in (TaskState.TASK_STATE_SUBMITTED, TaskState.TASK_STATE_WORKING)
    run_id = str(dict(task.metadata)["run_id"])
    updates = [i.status_update for i in items if i.HasField("status_update")]
    assert updates and updates[-1].status.state == TaskState.TASK_STATE_COMPLETED
    assert all(u.task_id == task.id for u in updates)
    assert TaskState.TASK_STATE_WORKING in {u.status.state for u in updates}
    artifacts = [i.artifact_update for i in items if i.HasField("artifact_update")]
    assert [p.text for a in artifacts for p in a.artifact.parts] == [ANSWER]
    done = next(
        n for n, i in enumerate(items) if i.status_update.status.state == updates[-1].status.state
    )
    assert items[done - 1].HasField("artifact_update")  # the answer, then it says completed
    # Fed by the run's events: each update carries one, in seq order, ending with delivered.
    stored = [e.kind.value for e in read_events(stack.engine, run_id).events]
    kinds = _event_kinds(items)
    assert kinds[-1] == "delivered" and kinds == stored[len(stored) - len(kinds) :]


@pytest.mark.timeout(90)
def test_subscribe_resumes_a_task_whose_stream_broke(stack, front) -> None:
    sent = message()
    # The first stream breaks after the task itself (the client goes away); no worker yet.
    [first] = streaming(front, lambda c: collect(c.send_message(sent), limit=1))
    assert first.task.status.state == TaskState.TASK_STATE_SUBMITTED
    task_id = first.task.id
    stack.worker()
    again = streaming(front, lambda c: collect(c.subscribe(SubscribeToTaskRequest(id=task_id))))
    assert again[0].HasField("task") and again[0].task.id == task_id
    if len(again) == 1:
        # The run ended before the subscription opened (a loaded machine): the task as it
        # stands says so, its answer among its artifacts, and nothing follows it.
        done = again[0].task
        assert done.status.state == TaskState.TASK_STATE_COMPLETED
        answer = [p.text for artifact in done.artifacts for p in artifact.parts]
    else:
        final = again[-1].status_update
        assert final.task_id == task_id and final.status.state == TaskState.TASK_STATE_COMPLETED
        parts = [i.artifact_update.artifact.parts for i in again if i.HasField("artifact_update")]
        answer = [p.text for ps in parts for p in ps]
    assert answer == [ANSWER]
    # Subscribing to the ended task gives it as it stands, with its answer, and ends.
    ended = streaming(front, lambda c: collect(c.subscribe(SubscribeToTaskRequest(id=task_id))))
    assert len(ended) == 1 and ended[0].task.status.state == TaskState.TASK_STATE_COMPLETED
    assert [p.text for a in ended[0].task.artifacts for p in a.parts] == [ANSWER]


@pytest.mark.timeout(60)
def test_subscribing_needs_the_read_right(stack, front) -> None:
    body = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "SubscribeToTask",
        "params": {"id": "whatever"},
    }
    r = httpx.post(
        f"{front}/a2a", json=body, headers={"Authorization": f"Bearer {STARTER}"}, timeout=10
    )
    assert r.status_code == 403 and r.json()["right"] == "read"


@pytest.fixture
def counted_front(stack, agents_file) -> Iterator[tuple[str, list[tuple[str, float]]]]:
    """The front in this process (uvicorn in a thread), and the run ids of the statements that
    read a run's events (store/events.py's one facts statement) on its engine, as they go out,
    each with the monotonic time it went out."""
    settings = replace(stack.settings, agents_file=agents_file, front_token=TOKEN)
    services = runtime_services.build(settings, stack.services.publisher, sealer=stack.sealer)
    reads: list[tuple[str, float]] = []

    def count(conn: Any, cursor: Any, statement: str, params: Any, *_: Any) -> None:
        if "'run' AS src" in statement and "FROM audit_events WHERE run_id" in statement:
            reads.append((str(params["id"]), time.monotonic()))

    # The process's one subscription, opened now: once subscribed it nudges every watch open
    # (nudges may have been missed), which would wake the first stream into one more read.
    warm = services.changes.open(str(uuid.uuid4()))
    assert warm.wait(10), "the front's run-changes subscription did not open"
    services.changes.close(warm)
    sa.event.listen(services.engine, "before_cursor_execute", count)
    app = create_app(services)
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning"))
    serving = threading.Thread(target=server.run, daemon=True)
    serving.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert time.monotonic() < deadline, "the in-process front did not start"
        time.sleep(0.05)
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}", reads
    finally:
        server.should_exit = True
        serving.join(10)
        sa.event.remove(services.engine, "before_cursor_execute", count)
        services.redis.close()


@pytest.mark.timeout(90)
def test_a_stream_opens_with_one_read_of_the_runs_events(stack, counted_front) -> None:
    """SendStreamingMessage and SubscribeToTask read the run's events once when they open,
    as the SSE route does (its first page, under the watch the follow then waits on), and the
    follow joins that read at its last seq: every later event once, none before it."""
    url, reads = counted_front

    async def first_then_hold(stream: Any) -> StreamResponse:
        async for item in stream:
            await asyncio.sleep(SETTLE_S)  # the stream is open and following; nothing new yet
            return item
        raise AssertionError("the stream ended before giving the task")

    # No worker: the run stays queued, so the stream opens and then waits on the run's nudge.
    first = streaming(url, lambda c: first_then_hold(c.send_message(message())))
    task_id, run_id = first.task.id, str(dict(first.task.metadata)["run_id"])
    assert first.task.status.state == TaskState.TASK_STATE_SUBMITTED
    # Both methods open through the same `_stream`; its reads are counted on the subscription
    # below, where no nudge of the run can land meanwhile (this run's own "queued" nudge may
    # reach the watch after it opened, a legitimate second read).
    assert run_id in [r for r, _ in reads]

    # What the subscription opens on (read before counting: the stack shares the front's engine).
    seen = len(read_events(stack.engine, run_id).events)
    reads.clear()
    opened: list[tuple[str, float]] = []

    async def subscribe(c: Client) -> list[StreamResponse]:
        got: list[StreamResponse] = []
        async for item in c.subscribe(SubscribeToTaskRequest(id=task_id)):
            got.append(item)
            if len(got) == 1:
                await asyncio.sleep(SETTLE_S)
                opened.extend(reads)
                await asyncio.to_thread(stack.worker)  # now the run goes on to its end
        return got

    items = streaming(url, subscribe)
    # A read a follower's re-check makes (RECHECK_S after it began waiting, should the client
    # take that long to get the first item on a loaded machine) is not an opening read.
    opening = [r for r, at in opened if at - opened[0][1] < RECHECK_S * 0.9] if opened else []
    assert opening == [run_id], f"SubscribeToTask read the run's events {len(opening)} times"
    assert items[0].HasField("task")
    assert items[-1].status_update.status.state == TaskState.TASK_STATE_COMPLETED
    # The follow began right after the opening read: each later event once, in order.
    events = read_events(stack.engine, run_id).events
    updates = [
        MessageToDict(i.status_update.metadata)["event"]
        for i in items
        if i.HasField("status_update")
    ]
    assert [int(u["seq"]) for u in updates] == [e.seq for e in events[seen:]]
    assert _event_kinds(items) == [e.kind.value for e in events[seen:]]
