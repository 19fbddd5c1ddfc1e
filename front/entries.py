"""Entry endpoints: webhooks, ticket events and co-pilot turns (A2A tasks are in `a2a.py`,
Teams activities in `teams.py`); each kind's start is its module in `runtime/entries/`.

Each is thin, like a Celery task: validate every field, then one runtime call in a worker
thread. The request key makes a repeated delivery return the run the first one made; keys are
the token's principal's own (another principal's event id makes another run).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import structlog
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from front.auth import Right, principal, requires, services
from front.body import KEY_PART, Fields, path_id, read_json
from front.errors import FrontError
from front.parts import FrontPart
from runtime.entries.client import AGENT_NAME
from runtime.entries.copilot import start_copilot_turn
from runtime.entries.start import UnknownAgent, entry_target
from runtime.entries.ticket_event import start_ticket_event
from runtime.entries.webhook import start_webhook
from runtime.ops.signals import publish
from runtime.services import Services
from store.rows import RunId

log = structlog.get_logger("front")


def known_target(s: Services, name: str) -> bool:
    """Whether `name` is a declared workflow (True) or a catalog agent (False): 404 with what
    is known when it is neither."""
    try:
        return entry_target(s, name)
    except UnknownAgent as exc:
        raise FrontError(404, str(exc)) from None
    except ValueError as exc:
        raise _unreadable(s, exc) from None


def _unreadable(s: Services, exc: ValueError) -> FrontError:
    return FrontError(
        500,
        f"the agent catalog {s.settings.agents_file} cannot be read ({exc}); "
        "fix the file or LIYAGENT_AGENTS_FILE",
    )


def _start(
    s: Services,
    agent: str,
    start: Callable[..., tuple[RunId, bool]],
    *args: str,
    who: str,
    **extra: Any,
) -> tuple[RunId, bool]:
    """Start the entry's run of `agent`, a catalog agent or (where the entry allows) a declared
    workflow of that name: 404 when it is neither."""
    known_target(s, agent)
    return start(s, agent, *args, principal=who, **extra)


def _who(request: Request) -> str:
    """The principal whose token starts the run: it scopes the request key and the reads."""
    return principal(request).name


def _accepted(run_id: str, created: bool, **extra: Any) -> Response:
    return JSONResponse({"run_id": run_id, "created": created, **extra}, status_code=202)


@requires(Right.START)
async def webhook(request: Request) -> Response:
    """POST /webhooks/{name} {"event_id", "input"}: one run per name and event id, of the catalog
    agent `name`; of the declared workflow `name` (no agent has it): {"event_id", "params"?},
    its parameters an object."""
    name = path_id(request.path_params["agent"], "agent", AGENT_NAME)
    body = await read_json(request)
    f = Fields(body, {"event_id", "input", "params"})
    event_id = f.ident("event_id")
    s = services(request)
    if await run_in_threadpool(known_target, s, name):
        params = {} if body.get("params") is None else body["params"]
        if not isinstance(params, dict) or "input" in body:
            raise FrontError(
                400, f'{name} is a workflow: send its "params" (an object), not "input"'
            )
        run_id, created = await run_in_threadpool(
            lambda: start_webhook(s, name, event_id, "", principal=_who(request), params=params)
        )
    else:
        if "params" in body:
            raise FrontError(
                400, f'{name} is an agent: send its "input"; "params" are a workflow\'s'
            )
        text = f.text("input")
        run_id, created = await run_in_threadpool(
            _start, s, name, start_webhook, event_id, text, who=_who(request)
        )
    log.info("front.webhook", run_id=run_id, created=created, agent=name, event_id=event_id)
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
        start_ticket_event,
        ticket,
        event_id,
        kind,
        text,
        who=_who(request),
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
        start_copilot_turn,
        conversation,
        turn,
        text,
        user,
        who=_who(request),
    )
    log.info("front.copilot_turn", run_id=run_id, created=created, conversation=conversation)
    return _accepted(run_id, created)


@requires(Right.START)
async def event_publish(request: Request) -> Response:
    """POST /events/{name} {"match"?, "payload"?, "key"?}: publish an event to the workflows of
    this principal waiting for it (an operator's token: to every run's); the same key
    publishes nothing more. 202 with its id; a bad name, match or payload a 400, nothing
    stored."""
    name = path_id(request.path_params["name"], "event", KEY_PART)
    body = await read_json(request)
    f = Fields(body, {"match", "payload", "key"})
    match = f.name("match") if body.get("match") is not None else None
    key = f.optional_ident("key")
    who = principal(request)
    scope = who.scope()
    event_id = await run_in_threadpool(
        lambda: publish(
            services(request), name, body.get("payload"), match=match, key=key, by=who.name,
            principal=None if scope.every else who.name,
        )
    )  # fmt: skip
    log.info("front.event_published", name=name, event_id=event_id, by=who.name)
    return JSONResponse({"event": name, "event_id": event_id}, status_code=202)


# The webhook, ticket event and co-pilot routes (`liyagent.front_routes`, pyproject.toml).
PART = FrontPart(
    "entries",
    [
        Route("/webhooks/{agent}", webhook, methods=["POST"]),
        Route("/tickets/{ticket_id}/events", ticket_event, methods=["POST"]),
        Route("/events/{name}", event_publish, methods=["POST"]),
        Route("/copilot/turns", copilot_turn, methods=["POST"]),
    ],
)
