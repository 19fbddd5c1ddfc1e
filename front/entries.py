"""Entry endpoints: webhooks, ticket events and co-pilot turns (A2A tasks are in `a2a.py`,
Teams activities in `teams.py`).

Each is thin, like a Celery task: validate every field, then one runtime call in a worker
thread. The request key makes a repeated delivery return the run the first one made.
"""

from __future__ import annotations

from typing import Any

import structlog
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from front.auth import Right, requires, services
from front.body import KEY_PART, Fields, path_id, read_json
from front.errors import FrontError
from runtime.core import catalog
from runtime.entries.client import AGENT_NAME
from runtime.entries.entries import s_catalog, start_entry
from runtime.services import Services
from runtime.toolbox.tools import AgentDef
from store.rows import RunId

log = structlog.get_logger("front")


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
