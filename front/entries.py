"""Entry endpoints: webhooks, ticket events, co-pilot turns, A2A tasks and Teams messages.

Each is thin, like a Celery task: validate every field, then one runtime call in a worker
thread. The request key makes a repeated delivery return the run the first one made.
"""

from __future__ import annotations

import uuid
from typing import Any

import structlog
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from front.auth import Right, protected, requires, services
from front.body import KEY_PART, Fields, path_id, read_json
from front.errors import FrontError
from runtime import catalog
from runtime.client import AGENT_NAME, Client
from runtime.enqueue import NewRun, enqueue
from runtime.entries import intake_teams, receive_teams, s_catalog, start_entry
from runtime.services import Services
from runtime.tools import AgentDef
from store.entries import EntryLink, get_a2a_task
from store.rows import RunId

log = structlog.get_logger("front")

# Run states in which an A2A task that still says "submitted" is reported as "working".
_WORKING = frozenset({"queued", "running", "waiting", "answered"})


def known_agent(s: Services, name: str) -> AgentDef:
    """The catalog's agent `name`: 404 with the catalog's message when there is none."""
    try:
        found = s_catalog(s)
    except ValueError as exc:
        raise FrontError(
            500,
            f"the agent catalog {s.settings.agents_file} cannot be read ({exc}); "
            "fix the file or LIYAGENT_AGENTS_FILE",
        ) from None
    try:
        return found.agent(name)
    except catalog.CatalogError as exc:
        raise FrontError(404, str(exc)) from None


def _start(s: Services, agent: str, **entry: Any) -> tuple[RunId, bool]:
    known_agent(s, agent)
    return start_entry(s, agent=agent, **entry)


def _accepted(run_id: str, created: bool, **extra: Any) -> Response:
    return JSONResponse({"run_id": run_id, "created": created, **extra}, status_code=202)


@requires(Right.START)
async def webhook(request: Request) -> Response:
    """POST /webhooks/{agent} {"event_id", "input"}: one run per agent and event id."""
    agent = path_id(request.path_params["agent"], "agent", AGENT_NAME)
    f = Fields(await read_json(request), {"event_id", "input"})
    event_id, text = f.ident("event_id"), f.text("input")
    run_id, created = await run_in_threadpool(
        _start,
        services(request),
        agent,
        entry_kind="webhook",
        user_input=text,
        request_key=f"webhook:{agent}:{event_id}",
        owner="webhook",
        channel="webhook",
    )
    log.info("front.webhook", run_id=run_id, created=created, agent=agent, event_id=event_id)
    return _accepted(run_id, created)


@requires(Right.START)
async def ticket_event(request: Request) -> Response:
    """POST /tickets/{ticket_id}/events {"event_id", "agent", "type", "text"}."""
    ticket = path_id(request.path_params["ticket_id"], "ticket id", KEY_PART)
    f = Fields(await read_json(request), {"event_id", "agent", "type", "text"})
    event_id, agent = f.ident("event_id"), f.ident("agent", AGENT_NAME)
    kind, text = f.name("type"), f.text("text")
    run_id, created = await run_in_threadpool(
        _start,
        services(request),
        agent,
        entry_kind="ticket_event",
        user_input=f"Ticket {ticket} event {kind}:\n{text}",
        request_key=f"ticket:{ticket}:{event_id}",
        owner="tickets",
        channel="tickets",
    )
    log.info("front.ticket_event", run_id=run_id, created=created, ticket=ticket, event_id=event_id)
    return _accepted(run_id, created)


@requires(Right.START)
async def copilot_turn(request: Request) -> Response:
    """POST /copilot/turns {"conversation", "turn_id", "agent", "text", "user"}."""
    f = Fields(await read_json(request), {"conversation", "turn_id", "agent", "text", "user"})
    conversation, turn = f.ident("conversation", KEY_PART), f.ident("turn_id")
    agent, text, user = f.ident("agent", AGENT_NAME), f.text("text"), f.name("user")
    run_id, created = await run_in_threadpool(
        _start,
        services(request),
        agent,
        entry_kind="copilot",
        user_input=text,
        request_key=f"copilot:{conversation}:{turn}",
        owner=user,
        channel="copilot",
    )
    log.info("front.copilot_turn", run_id=run_id, created=created, conversation=conversation)
    return _accepted(run_id, created)


def _submit_a2a(s: Services, task_id: str, agent: str, message: str) -> tuple[RunId, bool]:
    """A managed run (it may wait for approvals) linked to its A2A task in one statement."""
    definition = known_agent(s, agent)
    new = NewRun(
        agent=agent,
        user_input=message,
        model=definition.model,
        tools=definition.tools,
        system=definition.system,
        owner="a2a",
        entry_kind="a2a",
        channel="a2a",
        request_key=f"a2a:{task_id}",
        link=EntryLink("a2a", task_id),
    )
    return enqueue(s, new)


@requires(Right.START)
async def a2a_submit(request: Request) -> Response:
    """POST /a2a/tasks {"id"?, "agent", "message"}: the id defaults to a new UUID."""
    f = Fields(await read_json(request), {"id", "agent", "message"})
    task_id = f.optional_ident("id") or str(uuid.uuid4())
    agent, message = f.ident("agent", AGENT_NAME), f.text("message")
    run_id, created = await run_in_threadpool(
        _submit_a2a, services(request), task_id, agent, message
    )
    log.info("front.a2a_submitted", run_id=run_id, created=created, task_id=task_id)
    return _accepted(run_id, created, id=task_id, status="submitted")


def _a2a_view(s: Services, task_id: str) -> dict[str, Any]:
    with s.engine.connect() as conn:
        row = get_a2a_task(conn, task_id)
    if row is None:
        raise FrontError(404, f"no A2A task {task_id!r}; submit it with POST /a2a/tasks")
    status = str(row.status)
    if status == "submitted" and Client(s).get(row.run_id).status in _WORKING:
        status = "working"
    return {"id": row.id, "run_id": row.run_id, "status": status, "answer": row.answer}


@protected
async def a2a_read(request: Request) -> Response:
    """GET /a2a/tasks/{id}: submitted, working, completed or failed, with the answer."""
    task_id = path_id(request.path_params["task_id"], "task id")
    return JSONResponse(await run_in_threadpool(_a2a_view, services(request), task_id))


def _receive_teams(s: Services, **message: str) -> tuple[int, bool]:
    """Put the message in the durable inbox, then start its run now; if starting fails, the
    row is kept and beat's Teams intake starts it within a sweep interval."""
    known_agent(s, message["agent"])
    inbox_id, created = receive_teams(s, **message)
    try:
        intake_teams(s)
    except Exception as exc:
        log.warning(
            "front.teams_intake_failed",
            inbox_id=inbox_id,
            error=repr(exc),
            next="the message is kept; beat's Teams intake starts its run",
        )
    return inbox_id, created


@requires(Right.START)
async def teams_message(request: Request) -> Response:
    """POST /teams/messages {"message_id", "conversation", "sender", "agent", "text"}."""
    f = Fields(await read_json(request), {"message_id", "conversation", "sender", "agent", "text"})
    message = {
        "message_id": f.ident("message_id"),
        "conversation": f.name("conversation"),
        "sender": f.name("sender"),
        "agent": f.ident("agent", AGENT_NAME),
        "text": f.text("text"),
    }
    inbox_id, created = await run_in_threadpool(_receive_teams, services(request), **message)
    log.info("front.teams_message", inbox_id=inbox_id, message_id=message["message_id"])
    return JSONResponse({"inbox_id": inbox_id, "created": created}, status_code=202)
