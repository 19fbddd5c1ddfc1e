"""A2A 1.0 over JSON-RPC, as `a2a-sdk` serves it: the agent card and the endpoint.

The SDK parses and answers the JSON-RPC (`JsonRpcDispatcher`); its request handler over
liyagent's runs is `a2a_tasks.TaskHandler`. Each catalog agent is a skill; a task is a managed
run (it may wait for approvals), named after the message that created it, so a repeated message
id is the same task and a client that lost the answer finds the task again by that id. A task's
state is its run's: queued before any start is submitted, running is working, waiting on an
approval is auth-required (a person must authorize a held write), succeeded is completed with
the answer as the task's one artifact, failed is failed (canceled when CancelTask stopped it).
The card says streaming: SendStreamingMessage and SubscribeToTask stream the task's updates
from its run's events (front/a2a_tasks.py). Every method sees only the principal's own tasks
(all of them with `operate`, front/auth.py): the principal rides in each call's context.

The card is public (no token), so it says only what a client needs to call: each skill's name
and its catalog `description`, never an agent's system prompt, tools or model.
"""

from __future__ import annotations

from typing import Any

from a2a.auth.user import User
from a2a.server.jsonrpc_models import InvalidParamsError, JSONParseError, JSONRPCError
from a2a.server.request_handlers.response_helpers import (
    agent_card_to_dict,
    build_error_response,
)
from a2a.server.routes.common import DefaultServerCallContextBuilder
from a2a.server.routes.jsonrpc_dispatcher import JsonRpcDispatcher
from a2a.types import (
    AgentCapabilities,
    AgentCard,
    AgentInterface,
    AgentSkill,
    HTTPAuthSecurityScheme,
    SecurityRequirement,
    SecurityScheme,
    StringList,
)
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from front.a2a_tasks import TaskHandler, TokenUser
from front.auth import Right, lacks_right, principal, protected, services
from front.body import BadJson, parse_json, read_limited
from front.errors import FrontError
from front.parts import FrontPart
from runtime.entries.start import agents
from runtime.services import Services

RPC_PATH = "/a2a"


def agent_card(s: Services, base_url: str) -> AgentCard:
    """The front as one A2A agent: each catalog agent a skill (its name and public description
    only: no prompt, tool or model), the JSON-RPC endpoint, and the front's bearer token as
    its security scheme."""
    catalog = agents(s.settings, s.tools)
    skills = [
        AgentSkill(
            id=name,
            name=name,
            description=definition.description or f"The {name} agent.",
            tags=["agent"],
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
        capabilities=AgentCapabilities(streaming=True, push_notifications=False),
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


# The right each A2A method that changes something, or follows a task's stream, needs; reading
# tasks once (GetTask, ListTasks) needs none. Every method sees the principal's own tasks only
# (every task with `operate`).
METHOD_RIGHTS = {
    "SendMessage": Right.START,
    "SendStreamingMessage": Right.START,
    "CancelTask": Right.STOP,
    "SubscribeToTask": Right.READ,
}


def _method(parsed: Any) -> str | None:
    """The JSON-RPC method the request names, if any (else the SDK answers the error)."""
    method = parsed.get("method") if isinstance(parsed, dict) else None
    return method if isinstance(method, str) else None


def _refused(exc: BadJson) -> Response:
    """The JSON-RPC error for a body the SDK is not given: a parse error when it is malformed
    or nested too deep, invalid params when it holds a string that cannot be stored."""
    error: JSONRPCError = (
        JSONParseError(message=str(exc)) if exc.malformed else InvalidParamsError(message=str(exc))
    )
    given = exc.parsed.get("id") if isinstance(exc.parsed, dict) else None
    request_id = given if isinstance(given, str | int) and not isinstance(given, bool) else None
    return JSONResponse(build_error_response(request_id, error))


@protected
async def rpc(request: Request) -> Response:
    """POST /a2a: one A2A JSON-RPC request (the body at most 1 MiB), answered by the SDK. A
    method that starts or cancels a run needs that right of the token's principal; the
    principal is what the method may see, and is recorded as who acted."""
    body = await read_limited(request)
    try:
        parsed = parse_json(body)  # the SDK parses it again, known to be within bounds
    except BadJson as exc:
        return _refused(exc)
    who = principal(request)
    needed = METHOD_RIGHTS.get(_method(parsed) or "")
    if needed is not None and needed not in who.rights:
        raise lacks_right(who.name, needed)

    async def replay() -> dict[str, Any]:
        return {"type": "http.request", "body": body, "more_body": False}

    dispatcher: JsonRpcDispatcher = request.app.state.a2a
    return await dispatcher.handle_requests(Request(request.scope, replay))


class PrincipalContext(DefaultServerCallContextBuilder):
    """Each call's context names the token's principal (`protected` put it on the request), so
    the handler, streams included, reads and acts as that principal only."""

    def build_user(self, request: Request) -> User:
        return TokenUser(principal(request))


def dispatcher(s: Services) -> JsonRpcDispatcher:
    """The SDK's JSON-RPC dispatcher over this front's task handler."""
    return JsonRpcDispatcher(TaskHandler(s), context_builder=PrincipalContext())


def _setup(app: Starlette, s: Services) -> None:
    """The app's one dispatcher, read by `rpc`."""
    app.state.a2a = dispatcher(s)


# The agent card and the JSON-RPC endpoint (`liyagent.front_routes`, pyproject.toml; the
# `a2a` extra).
PART = FrontPart(
    "a2a",
    [
        Route("/.well-known/agent-card.json", card, methods=["GET"]),
        Route(RPC_PATH, rpc, methods=["POST"]),
    ],
    _setup,
)
