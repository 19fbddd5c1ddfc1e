"""A remote agent speaking A2A 1.0 over JSON-RPC (`POST /a2a`), as `a2a-sdk` clients expect.

Its card is at `GET /a2a/.well-known/agent-card.json`. `SendMessage` completes a task at once,
answering "<skill> handled: <text>" as the task's artifact; the skill is the message's (or the
request's) `metadata.skill`. A new task is named after the message that created it (its
`messageId`), so a client that lost the answer finds the task again with `GetTask`. A repeated
message is never deduplicated: it adds another task row, so a message sent twice shows in the
records. Requests and answers are the SDK's own protobuf types in their JSON form.
"""

from __future__ import annotations

import uuid
from typing import Any

from a2a.types import (
    AgentCapabilities,
    AgentCard,
    AgentInterface,
    AgentSkill,
    Artifact,
    GetTaskRequest,
    Part,
    SendMessageRequest,
    SendMessageResponse,
    Task,
    TaskState,
    TaskStatus,
)
from google.protobuf.json_format import MessageToDict, ParseDict, ParseError
from google.protobuf.message import Message as ProtoMessage

from simulators import store
from simulators.wire import Call, Response

# JSON-RPC and A2A error codes (A2A 1.0, JSON-RPC binding).
PARSE_ERROR, INVALID_REQUEST, METHOD_NOT_FOUND, INVALID_PARAMS = -32700, -32600, -32601, -32602
TASK_NOT_FOUND, TASK_NOT_CANCELABLE, UNSUPPORTED = -32001, -32002, -32004
_METHODS = {"SendMessage": SendMessageRequest, "GetTask": GetTaskRequest}


class RpcError(Exception):
    """A JSON-RPC error answer (HTTP 200 with an error object, as the binding has it)."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def _answer(request_id: Any, result: Any = None, error: RpcError | None = None) -> Response:
    body: dict[str, Any] = {"jsonrpc": "2.0", "id": request_id}
    if error is not None:
        body["error"] = {"code": error.code, "message": error.message}
    else:
        body["result"] = result
    return Response(200, body)


def rpc(call: Call) -> Response:
    """`POST /a2a`: one JSON-RPC request (no batches)."""
    request = call.request
    if request.body_error is not None:
        return _answer(None, error=RpcError(PARSE_ERROR, request.body_error))
    body = request.body
    if not isinstance(body, dict) or body.get("jsonrpc") != "2.0" or "method" not in body:
        return _answer(None, error=RpcError(INVALID_REQUEST, "not a JSON-RPC 2.0 request"))
    request_id = body.get("id")
    try:
        return _answer(request_id, result=_dispatch(call, str(body["method"]), body))
    except RpcError as exc:
        return _answer(request_id, error=exc)


def _dispatch(call: Call, method: str, body: dict[str, Any]) -> dict[str, Any]:
    if method == "CancelTask":
        found = store.a2a_task(call.conn, str((body.get("params") or {}).get("id", "")))
        if found is None:
            raise RpcError(TASK_NOT_FOUND, "task not found")
        raise RpcError(TASK_NOT_CANCELABLE, "the task is completed")
    kind = _METHODS.get(method)
    if kind is None:
        raise RpcError(METHOD_NOT_FOUND, f"method {method} is not served here")
    params = _params(body.get("params"), kind())
    if isinstance(params, SendMessageRequest):
        return _send(call, params)
    assert isinstance(params, GetTaskRequest)
    row = store.a2a_task(call.conn, params.id)
    if row is None:
        raise RpcError(TASK_NOT_FOUND, f"task {params.id} not found")
    return MessageToDict(_task(row))


def _params(raw: Any, into: ProtoMessage) -> ProtoMessage:
    if not isinstance(raw, dict):
        raise RpcError(INVALID_PARAMS, "params must be an object")
    try:
        return ParseDict(raw, into, ignore_unknown_fields=True)
    except ParseError as exc:
        raise RpcError(INVALID_PARAMS, f"params do not fit {type(into).__name__}: {exc}") from None


def _send(call: Call, params: SendMessageRequest) -> dict[str, Any]:
    message = params.message
    text = "\n".join(p.text for p in message.parts if p.text)
    if not message.message_id or not text.strip():
        raise RpcError(INVALID_PARAMS, "a message needs a messageId and a text part")
    if message.task_id:
        raise RpcError(UNSUPPORTED, "this agent takes one message per task")
    skill = _skill(message.metadata) or _skill(params.metadata)
    row = store.insert_a2a_task(
        call.conn,
        message.message_id,
        skill,
        text,
        f"{skill or 'remote-agent'} handled: {text}",
        message.context_id or str(uuid.uuid4()),
    )
    return MessageToDict(SendMessageResponse(task=_task(row)))


def _skill(metadata: Any) -> str | None:
    value = dict(metadata).get("skill") if metadata is not None else None
    return value if isinstance(value, str) and value.strip() else None


def _task(row: dict[str, Any]) -> Task:
    """A stored task row as an A2A task: completed, its answer the one artifact."""
    return Task(
        id=row["id"],
        context_id=row.get("context_id") or "",
        status=TaskStatus(state=TaskState.TASK_STATE_COMPLETED),
        artifacts=[
            Artifact(
                artifact_id=f"{row['id']}-answer", name="answer", parts=[Part(text=row["answer"])]
            )
        ],
    )


def agent_card(call: Call) -> Response:
    """`GET /a2a/.well-known/agent-card.json`: the card, naming the JSON-RPC endpoint."""
    host = call.request.host or "127.0.0.1"
    card = AgentCard(
        name="remote-agent",
        description="A remote agent simulator: completes each task at once.",
        version="1.0.0",
        supported_interfaces=[
            AgentInterface(
                url=f"http://{host}/a2a", protocol_binding="JSONRPC", protocol_version="1.0"
            )
        ],
        capabilities=AgentCapabilities(streaming=False, push_notifications=False),
        default_input_modes=["text/plain"],
        default_output_modes=["text/plain"],
        skills=[
            AgentSkill(id="remote-agent", name="remote-agent", description="Answers anything.")
        ],
    )
    return Response(200, MessageToDict(card))
