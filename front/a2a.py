"""A2A 1.0 over JSON-RPC, as `a2a-sdk` serves it: the agent card and the task methods.

The SDK parses and answers the JSON-RPC (`JsonRpcDispatcher`); this module is its request
handler over liyagent's runs. Each catalog agent is a skill; a task is a managed run (it may
wait for approvals), named after the message that created it, so a repeated message id is the
same task and a client that lost the answer finds the task again by that id. A task's state is
its run's: queued before any start is submitted, running is working, waiting on an approval is
auth-required (a person must authorize a held write), succeeded is completed with the answer as
the task's one artifact, failed is failed (canceled when CancelTask stopped it).
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncGenerator, Callable
from datetime import UTC, datetime
from typing import Any, NoReturn, TypeVar

import structlog
from a2a.server.context import ServerCallContext
from a2a.server.request_handlers.request_handler import RequestHandler, validate_request_params
from a2a.server.request_handlers.response_helpers import agent_card_to_dict
from a2a.server.routes.jsonrpc_dispatcher import JsonRpcDispatcher
from a2a.types import (
    AgentCapabilities,
    AgentCard,
    AgentInterface,
    AgentSkill,
    Artifact,
    CancelTaskRequest,
    DeleteTaskPushNotificationConfigRequest,
    ExtendedAgentCardNotConfiguredError,
    GetExtendedAgentCardRequest,
    GetTaskPushNotificationConfigRequest,
    GetTaskRequest,
    HTTPAuthSecurityScheme,
    InternalError,
    InvalidParamsError,
    ListTaskPushNotificationConfigsRequest,
    ListTaskPushNotificationConfigsResponse,
    ListTasksRequest,
    ListTasksResponse,
    Message,
    Part,
    PushNotificationNotSupportedError,
    Role,
    SecurityRequirement,
    SecurityScheme,
    SendMessageRequest,
    StringList,
    SubscribeToTaskRequest,
    Task,
    TaskNotCancelableError,
    TaskNotFoundError,
    TaskPushNotificationConfig,
    TaskState,
    TaskStatus,
    UnsupportedOperationError,
)
from a2a.utils.constants import DEFAULT_LIST_TASKS_PAGE_SIZE
from a2a.utils.errors import A2AError
from a2a.utils.task import (
    ListTasksCursor,
    apply_history_length,
    decode_list_tasks_cursor,
    encode_list_tasks_cursor,
    validate_history_length,
    validate_page_size,
)
from google.protobuf.json_format import MessageToDict, ParseDict
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from front.auth import protected, services
from front.body import ID, MAX_TEXT_BYTES, read_limited
from front.errors import FrontError
from runtime.client import Client
from runtime.enqueue import BadRequest, NewRun, enqueue
from runtime.entries import s_catalog
from runtime.services import Services
from runtime.tools import AgentDef
from store.entries import A2ATask, EntryLink, get_a2a_task, list_a2a_tasks, mark_a2a_canceled

log = structlog.get_logger("front")
T = TypeVar("T")

RPC_PATH = "/a2a"
STATES = {
    "submitted": TaskState.TASK_STATE_SUBMITTED,
    "working": TaskState.TASK_STATE_WORKING,
    "auth-required": TaskState.TASK_STATE_AUTH_REQUIRED,
    "completed": TaskState.TASK_STATE_COMPLETED,
    "failed": TaskState.TASK_STATE_FAILED,
    "canceled": TaskState.TASK_STATE_CANCELED,
}
_NAMES = {state: name for name, state in STATES.items()}
# States a SendMessage that may block answers at: the task ended or needs a person.
_SETTLED = frozenset({"completed", "failed", "canceled", "auth-required"})
_POLL_S = 0.25


def agent_card(s: Services, base_url: str) -> AgentCard:
    """The front as one A2A agent: each catalog agent a skill, the JSON-RPC endpoint, and the
    front's bearer token as its security scheme."""
    catalog = s_catalog(s)
    skills = [
        AgentSkill(
            id=name,
            name=name,
            description=definition.system or f"The {name} agent.",
            tags=list(definition.tools or []),
            input_modes=["text/plain"],
            output_modes=["text/plain"],
        )
        for name, definition in sorted(catalog.agents.items())
    ]
    return AgentCard(
        name="liyagent",
        description=(
            "Durable agent runs: each skill is an agent; a task is a managed run that survives "
            "the loss of its worker. Name the skill in the message's metadata.skill."
        ),
        version="1.0.0",
        supported_interfaces=[
            AgentInterface(
                url=f"{base_url}{RPC_PATH}", protocol_binding="JSONRPC", protocol_version="1.0"
            )
        ],
        capabilities=AgentCapabilities(streaming=False, push_notifications=False),
        security_schemes={
            "bearer": SecurityScheme(
                http_auth_security_scheme=HTTPAuthSecurityScheme(
                    scheme="Bearer", description="the front's token (LIYAGENT_FRONT_TOKEN)"
                )
            )
        },
        security_requirements=[SecurityRequirement(schemes={"bearer": StringList()})],
        default_input_modes=["text/plain"],
        default_output_modes=["text/plain"],
        skills=skills,
    )


async def card(request: Request) -> Response:
    """GET /.well-known/agent-card.json (no token: the card says how to authenticate)."""
    s = services(request)
    base = s.settings.public_url or str(request.base_url).rstrip("/")
    try:
        found = await run_in_threadpool(agent_card, s, base)
    except ValueError as exc:
        raise FrontError(
            500, f"the agent catalog cannot be read ({exc}); fix it or LIYAGENT_AGENTS_FILE"
        ) from None
    return JSONResponse(agent_card_to_dict(found))


@protected
async def rpc(request: Request) -> Response:
    """POST /a2a: one A2A JSON-RPC request (the body at most 1 MiB), answered by the SDK."""
    body = await read_limited(request)

    async def replay() -> dict[str, Any]:
        return {"type": "http.request", "body": body, "more_body": False}

    dispatcher: JsonRpcDispatcher = request.app.state.a2a
    return await dispatcher.handle_requests(Request(request.scope, replay))


def dispatcher(s: Services) -> JsonRpcDispatcher:
    """The SDK's JSON-RPC dispatcher over this front's task handler."""
    return JsonRpcDispatcher(TaskHandler(s))


def _text_of(message: Message) -> str:
    text = "\n".join(p.text for p in message.parts if p.text)
    if not text.strip():
        raise InvalidParamsError("send the task as one or more text parts")
    if len(text.encode("utf-8")) > MAX_TEXT_BYTES or "\x00" in text:
        raise InvalidParamsError(f"the text must be at most {MAX_TEXT_BYTES} bytes, without NUL")
    return text


def _skill(s: Services, params: SendMessageRequest) -> AgentDef:
    """The catalog agent the message names (metadata.skill), or the only one there is."""
    named = [dict(m).get("skill") for m in (params.message.metadata, params.metadata)]
    skill = next((n for n in named if isinstance(n, str) and n), None)
    catalog = s_catalog(s)
    agents = sorted(catalog.agents)
    if skill is None and len(agents) == 1:
        skill = agents[0]
    if skill is None or skill not in catalog.agents:
        said = "name the skill in metadata.skill" if skill is None else f"no skill {skill!r}"
        raise InvalidParamsError(f"{said}; the skills: {', '.join(agents)}")
    return catalog.agent(skill)


def _state(name: str) -> TaskState:
    return STATES[name]


def _agent_note(text: str) -> Message:
    return Message(message_id=str(uuid.uuid4()), role=Role.ROLE_AGENT, parts=[Part(text=text)])


def _status_note(row: A2ATask) -> str | None:
    if row.state == "auth-required" and row.waiting_on:
        approval = row.waiting_on.removeprefix("approval:")
        return (
            f"waiting for a person to approve a held call (approval {approval}); it is decided "
            f"with POST /approvals/{approval}/decision"
        )
    if row.state in ("failed", "canceled"):
        return row.failure_reason or row.answer
    return None


def task_of(row: A2ATask) -> Task:
    """The A2A task for a stored task and its run; the answer is its one artifact."""
    task = Task(id=row.id, context_id=row.context_id or "")
    task.status.CopyFrom(TaskStatus(state=_state(row.state)))
    task.status.timestamp.FromDatetime(row.updated_at)
    note = _status_note(row)
    if note:
        task.status.message.CopyFrom(_agent_note(note))
    if row.state == "completed" and row.answer is not None:
        task.artifacts.append(
            Artifact(artifact_id=f"{row.id}-answer", name="answer", parts=[Part(text=row.answer)])
        )
    if row.message:
        task.history.append(ParseDict(row.message, Message(), ignore_unknown_fields=True))
    task.metadata.update({"run_id": row.run_id, "skill": row.agent})
    return task


class TaskHandler(RequestHandler):
    """The SDK's request handler over liyagent's runs: SendMessage, GetTask, ListTasks and
    CancelTask; streaming and push notifications are not offered."""

    def __init__(self, s: Services) -> None:
        self.s = s

    async def _call(self, work: Callable[[], T]) -> T:
        """Run store and runtime work in a thread; an unexpected failure is logged and answered
        as a JSON-RPC internal error that says what to do (never a traceback)."""
        try:
            return await run_in_threadpool(work)
        except A2AError:
            raise
        except BadRequest as exc:
            raise InvalidParamsError(str(exc)) from None
        except Exception as exc:
            log.error("front.a2a_failed", error=repr(exc), exc_info=exc)
            raise InternalError(
                f"internal error ({type(exc).__name__}); retrying with the same messageId is "
                "safe, and the front's log has the details"
            ) from None

    def _task(self, task_id: str) -> A2ATask:
        with self.s.engine.connect() as conn:
            row = get_a2a_task(conn, task_id)
        if row is None:
            raise TaskNotFoundError(f"no task {task_id!r} here")
        return row

    def _submit(self, params: SendMessageRequest) -> tuple[str, bool]:
        """The message's task: a managed run linked to its task in one statement, once per
        message id."""
        message = params.message
        if not ID.fullmatch(message.message_id):
            raise InvalidParamsError(f"messageId must match {ID.pattern}")
        if message.role not in (Role.ROLE_USER, Role.ROLE_UNSPECIFIED):
            raise InvalidParamsError("the message must come from the user (ROLE_USER)")
        if message.task_id and message.task_id != message.message_id:
            self._task(message.task_id)
            raise UnsupportedOperationError(
                "a task here takes one message; send a new message without taskId"
            )
        text, definition = _text_of(message), _skill(self.s, params)
        context_id = message.context_id or str(uuid.uuid4())
        run_id, created = enqueue(
            self.s,
            NewRun(
                agent=definition.name,
                user_input=text,
                model=definition.model,
                tools=definition.tools,
                system=definition.system,
                owner="a2a",
                entry_kind="a2a",
                channel="a2a",
                request_key=f"a2a:{message.message_id}",
                link=EntryLink(
                    "a2a",
                    message.message_id,
                    context_id=context_id,
                    message=json.dumps(MessageToDict(message)),
                ),
            ),
        )
        log.info("front.a2a_task", task_id=message.message_id, run_id=run_id, created=created)
        return message.message_id, created

    @validate_request_params
    async def on_message_send(
        self, params: SendMessageRequest, context: ServerCallContext
    ) -> Task | Message:
        """SendMessage: the task this message makes (or made); unless the client asked to
        return at once, wait (bounded by LIYAGENT_A2A_WAIT_S) until it ends or needs a person."""
        validate_history_length(params.configuration)
        task_id, _ = await self._call(lambda: self._submit(params))
        row = await self._call(lambda: self._task(task_id))
        if not params.configuration.return_immediately:
            deadline = asyncio.get_running_loop().time() + self.s.settings.a2a_wait_s
            while row.state not in _SETTLED and asyncio.get_running_loop().time() < deadline:
                await asyncio.sleep(_POLL_S)
                row = await self._call(lambda: self._task(task_id))
        return apply_history_length(task_of(row), params.configuration)

    @validate_request_params
    async def on_get_task(self, params: GetTaskRequest, context: ServerCallContext) -> Task | None:
        """GetTask: the task as its run stands now."""
        validate_history_length(params)
        row = await self._call(lambda: self._task(params.id))
        return apply_history_length(task_of(row), params)

    @validate_request_params
    async def on_list_tasks(
        self, params: ListTasksRequest, context: ServerCallContext
    ) -> ListTasksResponse:
        """ListTasks: newest first, filtered by context, state and update time, paged."""
        validate_history_length(params)
        size = params.page_size or DEFAULT_LIST_TASKS_PAGE_SIZE
        validate_page_size(size)
        before = None
        if params.page_token:
            cursor = decode_list_tasks_cursor(params.page_token)
            if cursor is None or cursor.timestamp_ns is None:
                raise InvalidParamsError("pageToken is not one this server gave")
            before = (datetime.fromtimestamp(cursor.timestamp_ns / 1e9, tz=UTC), cursor.task_id)
        after = (
            params.status_timestamp_after.ToDatetime(tzinfo=UTC)
            if params.HasField("status_timestamp_after")
            else None
        )
        state = _NAMES.get(params.status) if params.status else None
        if params.status and state is None:
            return ListTasksResponse(page_size=size)

        def page() -> tuple[list[A2ATask], int]:
            with self.s.engine.connect() as conn:
                return list_a2a_tasks(
                    conn,
                    limit=size,
                    context_id=params.context_id or None,
                    state=state,
                    updated_after=after,
                    before=before,
                )

        rows, total = await self._call(page)
        token = ""
        if len(rows) == size:
            last = rows[-1]
            ns = int(last.created_at.timestamp() * 1_000_000) * 1000
            token = encode_list_tasks_cursor(ListTasksCursor(timestamp_ns=ns, task_id=last.id))
        return ListTasksResponse(
            tasks=[apply_history_length(task_of(r), params) for r in rows],
            next_page_token=token,
            page_size=size,
            total_size=total,
        )

    @validate_request_params
    async def on_cancel_task(
        self, params: CancelTaskRequest, context: ServerCallContext
    ) -> Task | None:
        """CancelTask: an operator Stop of the task's run (a queued or waiting run ends now, a
        running one at its next step); an ended task cannot be canceled."""

        def cancel() -> A2ATask:
            row = self._task(params.id)
            if row.state in ("completed", "failed", "canceled"):
                raise TaskNotCancelableError(f"task {row.id} already {row.state}")
            try:
                Client(self.s).stop(
                    run_id=row.run_id, reason=f"A2A CancelTask of task {row.id}", by="a2a"
                )
            except BadRequest as exc:
                raise TaskNotCancelableError(str(exc)) from None
            with self.s.engine.connect() as conn:
                mark_a2a_canceled(conn, row.id)
            log.info("front.a2a_canceled", task_id=row.id, run_id=row.run_id)
            return self._task(row.id)

        return task_of(await self._call(cancel))

    async def on_message_send_stream(
        self, params: SendMessageRequest, context: ServerCallContext
    ) -> AsyncGenerator[Any]:
        """Not offered (the card says streaming: false): use SendMessage and GetTask."""
        _unsupported("streaming is not offered; use SendMessage, then GetTask")
        yield  # pragma: no cover

    async def on_subscribe_to_task(
        self, params: SubscribeToTaskRequest, context: ServerCallContext
    ) -> AsyncGenerator[Any]:
        """Not offered: poll GetTask."""
        _unsupported("subscriptions are not offered; poll GetTask")
        yield  # pragma: no cover

    async def on_create_task_push_notification_config(
        self, params: TaskPushNotificationConfig, context: ServerCallContext
    ) -> TaskPushNotificationConfig:
        """Push notifications are not offered."""
        raise PushNotificationNotSupportedError

    async def on_get_task_push_notification_config(
        self, params: GetTaskPushNotificationConfigRequest, context: ServerCallContext
    ) -> TaskPushNotificationConfig:
        """Push notifications are not offered."""
        raise PushNotificationNotSupportedError

    async def on_list_task_push_notification_configs(
        self, params: ListTaskPushNotificationConfigsRequest, context: ServerCallContext
    ) -> ListTaskPushNotificationConfigsResponse:
        """Push notifications are not offered."""
        raise PushNotificationNotSupportedError

    async def on_delete_task_push_notification_config(
        self, params: DeleteTaskPushNotificationConfigRequest, context: ServerCallContext
    ) -> None:
        """Push notifications are not offered."""
        raise PushNotificationNotSupportedError

    async def on_get_extended_agent_card(
        self, params: GetExtendedAgentCardRequest, context: ServerCallContext
    ) -> AgentCard:
        """There is no extended card: the public one lists every skill."""
        raise ExtendedAgentCardNotConfiguredError


def _unsupported(message: str) -> NoReturn:
    raise UnsupportedOperationError(message)
