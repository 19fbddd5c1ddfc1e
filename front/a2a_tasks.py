"""The A2A request handler over liyagent's runs (the SDK's `RequestHandler`): SendMessage,
SendStreamingMessage, GetTask, ListTasks, CancelTask and SubscribeToTask, and how a run's state
reads as a task's.

A task is named after the message that created it; its state is its run's (see
`store.a2a.TASK_STATE_SQL`), its answer the one artifact, the message it came from its
history. A stream (SendStreamingMessage, SubscribeToTask) is the task, then one
TaskStatusUpdateEvent per run event (runtime/ops/events.py, the events `GET /runs/{id}/events`
sends; the event in its metadata, `event`) until the run's last, with the answer as a
TaskArtifactUpdateEvent before the first update that says completed. It waits on the run's
nudge between reads, holding no database connection. Push notifications are not offered.

Every method sees only the tasks of the request's principal (the front's bearer token, carried
in the SDK's `ServerCallContext` as a `TokenUser`), or all of them with `operate`; any other
task is not found, exactly as one that does not exist. Task ids are unique per principal:
another principal's message id is another task.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncGenerator, Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any, TypeVar

import structlog
from a2a.auth.user import User
from a2a.server.context import ServerCallContext
from a2a.server.request_handlers.request_handler import RequestHandler, validate_request_params
from a2a.types import (
    AgentCard,
    Artifact,
    CancelTaskRequest,
    DeleteTaskPushNotificationConfigRequest,
    ExtendedAgentCardNotConfiguredError,
    GetExtendedAgentCardRequest,
    GetTaskPushNotificationConfigRequest,
    GetTaskRequest,
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
    SendMessageRequest,
    SubscribeToTaskRequest,
    Task,
    TaskArtifactUpdateEvent,
    TaskNotCancelableError,
    TaskNotFoundError,
    TaskPushNotificationConfig,
    TaskState,
    TaskStatus,
    TaskStatusUpdateEvent,
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

from front.auth import Principal
from front.body import ID, MAX_TEXT_BYTES, text_problem
from runtime.base.redact import error_facts, frames
from runtime.core.enqueue import BadRequest
from runtime.entries import a2a
from runtime.entries.start import agents as declared_agents
from runtime.ops.events import RunEvent, first_page
from runtime.services import Services
from runtime.toolbox.tools import AgentDef
from store.a2a import A2ATask, get_a2a_task, list_a2a_tasks
from store.scope import Scope

log = structlog.get_logger("front")
T = TypeVar("T")

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
# States a task does not leave.
_ENDED = frozenset({"completed", "failed", "canceled"})
_POLL_S = 0.25
# What a SendMessage may carry besides its text (which is bounded by MAX_TEXT_BYTES): the
# request's and the message's metadata, its other parts and fields, as UTF-8 JSON.
MAX_METADATA_BYTES = 16 * 1024


class TokenUser(User):
    """The SDK's user for a request: the principal of the front's bearer token (front/a2a.py
    builds it into each call's context); what it may read, and who acts (a CancelTask's Stop)."""

    def __init__(self, principal: Principal) -> None:
        self.principal = principal

    @property
    def is_authenticated(self) -> bool:
        return True

    @property
    def user_name(self) -> str:
        return self.principal.name


def _principal(context: ServerCallContext | None) -> Principal:
    """The request's principal; a call without one (never routed so) is refused, fail closed."""
    user = None if context is None else context.user
    if not isinstance(user, TokenUser):
        raise InternalError("the request carries no principal; send it with a bearer token")
    return user.principal


def _text_of(message: Message) -> str:
    text = "\n".join(p.text for p in message.parts if p.text)
    if not text.strip():
        raise InvalidParamsError("send the task as one or more text parts")
    problem = text_problem(text)
    if problem is not None:
        raise InvalidParamsError(f"the message's text {problem}")
    return text


def _check_size(params: SendMessageRequest) -> None:
    """The message is stored whole (its history): everything but its text, metadata included,
    is bounded like the text is. (No string in it holds a NUL or a lone surrogate: the JSON-RPC
    body was refused otherwise, front/body.py.)"""
    stored = MessageToDict(params.message)
    for part in stored.get("parts", []):
        part.pop("text", None)
    rest = [stored, MessageToDict(params.metadata)]
    size = len(json.dumps(rest, ensure_ascii=False).encode("utf-8", "surrogatepass"))
    if size > MAX_METADATA_BYTES:
        raise InvalidParamsError(
            f"the message's metadata and other fields besides its text are {size} bytes as "
            f"JSON; at most {MAX_METADATA_BYTES} (the text may have {MAX_TEXT_BYTES})"
        )


def _skill(s: Services, params: SendMessageRequest) -> AgentDef:
    """The catalog agent the message names (metadata.skill), or the only one there is."""
    named = [dict(m).get("skill") for m in (params.message.metadata, params.metadata)]
    skill = next((n for n in named if isinstance(n, str) and n), None)
    catalog = declared_agents(s.settings, s.tools)
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


def _answer(row: A2ATask) -> Artifact | None:
    """A completed task's one artifact, its answer."""
    if row.state != "completed" or row.answer is None:
        return None
    return Artifact(artifact_id=f"{row.id}-answer", name="answer", parts=[Part(text=row.answer)])


def status_update(row: A2ATask, event: RunEvent) -> TaskStatusUpdateEvent:
    """The task's status after one of its run's events, the event in its metadata."""
    update = TaskStatusUpdateEvent(task_id=row.id, context_id=row.context_id or "")
    update.status.CopyFrom(task_of(row).status)
    update.metadata.update({"run_id": row.run_id, "event": event.to_json()})
    return update


def task_of(row: A2ATask) -> Task:
    """The A2A task for a stored task and its run; the answer is its one artifact."""
    task = Task(id=row.id, context_id=row.context_id or "")
    task.status.CopyFrom(TaskStatus(state=_state(row.state)))
    task.status.timestamp.FromDatetime(row.updated_at)
    note = _status_note(row)
    if note:
        task.status.message.CopyFrom(_agent_note(note))
    answer = _answer(row)
    if answer is not None:
        task.artifacts.append(answer)
    if row.message:
        task.history.append(ParseDict(row.message, Message(), ignore_unknown_fields=True))
    task.metadata.update({"run_id": row.run_id, "skill": row.agent})
    return task


@contextmanager
def _answered() -> Iterator[None]:
    """An unexpected failure of the work inside is logged and answered as a JSON-RPC internal
    error that says what to do (never a traceback); a refused request as invalid params."""
    try:
        yield
    except A2AError:
        raise
    except BadRequest as exc:
        raise InvalidParamsError(str(exc)) from None
    except Exception as exc:
        # Where it failed, never its message: a database error quotes the value it refused.
        log.error("front.a2a_failed", **error_facts(exc), frames=frames(exc))
        raise InternalError(
            f"internal error ({type(exc).__name__}); retrying with the same messageId is "
            "safe, and the front's log has the details"
        ) from None


class TaskHandler(RequestHandler):
    """The SDK's request handler over liyagent's runs: SendMessage, SendStreamingMessage,
    GetTask, ListTasks, CancelTask and SubscribeToTask; push notifications are not offered."""

    def __init__(self, s: Services) -> None:
        self.s = s

    async def _call(self, work: Callable[[], T]) -> T:
        """Run store and runtime work in a thread, its failures answered as `_answered` says."""
        with _answered():
            return await run_in_threadpool(work)

    def _task(self, task_id: str, scope: Scope) -> A2ATask:
        """The task as `scope` sees it; one it does not see is not found, as one never made."""
        with self.s.engine.connect() as conn:
            row = get_a2a_task(conn, task_id, scope)
        if row is None:
            raise TaskNotFoundError(f"no task {task_id!r} here")
        return row

    def _submit(self, params: SendMessageRequest, who: Principal) -> tuple[str, bool]:
        """The message's task: a run linked to its task in one statement, once per message id
        and principal (`runtime/entries/a2a.py`)."""
        message = params.message
        if not ID.fullmatch(message.message_id):
            raise InvalidParamsError(f"messageId must match {ID.pattern}")
        if message.role not in (Role.ROLE_USER, Role.ROLE_UNSPECIFIED):
            raise InvalidParamsError("the message must come from the user (ROLE_USER)")
        if message.task_id and message.task_id != message.message_id:
            self._task(message.task_id, who.scope())
            raise UnsupportedOperationError(
                "a task here takes one message; send a new message without taskId"
            )
        _check_size(params)
        text, definition = _text_of(message), _skill(self.s, params)
        context_id = message.context_id or str(uuid.uuid4())
        run_id, created = a2a.submit(
            self.s,
            definition.name,
            text,
            message.message_id,
            context_id,
            json.dumps(MessageToDict(message)),
            principal=who.name,
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
        who = _principal(context)
        task_id, _ = await self._call(lambda: self._submit(params, who))
        row = await self._call(lambda: self._task(task_id, who.scope()))
        if not params.configuration.return_immediately:
            deadline = asyncio.get_running_loop().time() + self.s.settings.a2a_wait_s
            while row.state not in _SETTLED and asyncio.get_running_loop().time() < deadline:
                await asyncio.sleep(_POLL_S)
                row = await self._call(lambda: self._task(task_id, who.scope()))
        return apply_history_length(task_of(row), params.configuration)

    @validate_request_params
    async def on_get_task(self, params: GetTaskRequest, context: ServerCallContext) -> Task | None:
        """GetTask: the task as its run stands now (one the principal may see)."""
        validate_history_length(params)
        scope = _principal(context).scope()
        row = await self._call(lambda: self._task(params.id, scope))
        return apply_history_length(task_of(row), params)

    @validate_request_params
    async def on_list_tasks(
        self, params: ListTasksRequest, context: ServerCallContext
    ) -> ListTasksResponse:
        """ListTasks: the tasks the principal may see, newest first, filtered by context, state
        and update time, paged."""
        validate_history_length(params)
        scope = _principal(context).scope()
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
                    scope=scope,
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
        """CancelTask: an operator Stop of the task's run (it and its children end now), of a
        task the principal may see; an ended task cannot be
        canceled. Who stops is the principal."""
        who = _principal(context)

        def cancel() -> A2ATask:
            row = self._task(params.id, who.scope())
            if row.state in ("completed", "failed", "canceled"):
                raise TaskNotCancelableError(f"task {row.id} already {row.state}")
            try:
                a2a.cancel(self.s, row.id, row.run_id, who.name)
            except BadRequest as exc:
                raise TaskNotCancelableError(str(exc)) from None
            log.info("front.a2a_canceled", task_id=row.id, run_id=row.run_id)
            return self._task(row.id, who.scope())

        return task_of(await self._call(cancel))

    async def _stream(
        self, task_id: str, scope: Scope, history: Any
    ) -> AsyncGenerator[Task | TaskStatusUpdateEvent | TaskArtifactUpdateEvent]:
        """The task, then a status update per run event until the run's last: the answer as
        an artifact once the task completed, before the first update that says so.

        The run's events are read once on opening, as the SSE route reads its first page
        (`first_page`, under a watch opened before the read); the task is read again after
        it, so its state includes every event up to that page's last seq, and the follow
        goes on from exactly there (an event between the two reads may repeat a state, never
        lose one)."""
        run_id = (await self._call(lambda: self._task(task_id, scope))).run_id
        with _answered():
            opened = await first_page(self.s.engine, self.s.changes, run_id, 0)
        try:
            row = await self._call(lambda: self._task(task_id, scope))
            yield apply_history_length(task_of(row), history)
            if row.state in _ENDED:
                return
            answered = False
            async for event in opened.passed().follow(self.s.engine):
                row = await self._call(lambda: self._task(task_id, scope))
                answer = _answer(row)
                if answer is not None and not answered:
                    answered = True
                    context_id = row.context_id or ""
                    yield TaskArtifactUpdateEvent(
                        task_id=row.id, context_id=context_id, artifact=answer, last_chunk=True
                    )
                yield status_update(row, event)
        finally:
            self.s.changes.close(opened.watch)

    async def on_message_send_stream(
        self, params: SendMessageRequest, context: ServerCallContext
    ) -> AsyncGenerator[Any]:
        """SendStreamingMessage: the message's task (made once per message id), then its
        updates as its run's events are recorded, until it ended."""
        validate_history_length(params.configuration)
        who = _principal(context)
        task_id, _ = await self._call(lambda: self._submit(params, who))
        async for item in self._stream(task_id, who.scope(), params.configuration):
            yield item

    async def on_subscribe_to_task(
        self, params: SubscribeToTaskRequest, context: ServerCallContext
    ) -> AsyncGenerator[Any]:
        """SubscribeToTask: the task as it stands, then its updates until it ended (a client
        whose stream broke subscribes again and goes on from the task's current state); a task
        the principal may see only."""
        async for item in self._stream(params.id, _principal(context).scope(), None):
            yield item

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
