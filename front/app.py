"""The front's Starlette app: routes, JSON errors and a structured access log. `create_app`
takes the services (tests pass their own); uvicorn uses `app_factory` with --factory.

`/metrics` (the Prometheus exposition, read from Postgres and Redis at scrape time) needs no
token, like Flower's: bind the front to a private interface, or keep it behind a proxy that
does not route `/metrics` from outside.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Sequence

import structlog
from prometheus_client.exposition import choose_encoder
from prometheus_client.registry import CollectorRegistry
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from front import erasure, events, runs
from front.errors import HANDLERS, route_of
from front.library_logs import withhold_library_values
from front.parts import FrontPart, installed
from runtime.ops.metrics import registry_for
from runtime.services import Services

log = structlog.get_logger("front")


async def metrics(request: Request) -> Response:
    """GET /metrics: the Prometheus exposition, collected now (no token: see the docstring)."""
    registry: CollectorRegistry = request.app.state.metrics
    encode, content_type = choose_encoder(request.headers.get("accept", ""))
    body = await run_in_threadpool(encode, registry)
    return Response(body, headers={"Content-Type": content_type})


# The core front, always mounted: health, metrics, runs, events, erasure, operator actions.
# Each entry kind's routes are its `FrontPart` (front/parts.py).
ROUTES = [
    Route("/healthz", runs.healthz, methods=["GET"]),
    Route("/metrics", metrics, methods=["GET"]),
    Route("/approvals/{approval_id}/decision", runs.approval_decision, methods=["POST"]),
    Route("/runs/{run_id}", runs.run_read, methods=["GET"]),
    Route("/runs/{run_id}/events", events.run_events, methods=["GET"]),
    Route("/runs/{run_id}/stop", runs.run_stop, methods=["POST"]),
    Route("/runs/{run_id}/signal", runs.run_signal, methods=["POST"]),
    Route("/runs/{run_id}/stop/lift", runs.run_stop_lift, methods=["POST"]),
    Route("/runs/{run_id}/erase", erasure.run_erase, methods=["POST"]),
    Route("/owners/{owner}/erase", erasure.owner_erase, methods=["POST"]),
    Route("/agents/{agent}/stop", runs.agent_stop, methods=["POST"]),
    Route("/agents/{agent}/stop/lift", runs.agent_stop_lift, methods=["POST"]),
]


class AccessLog:
    """One structured line per request: method, route (its template, not the path's values),
    status and duration (never a body or a header, so no token or user text reaches the
    log)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        status = 500
        started = time.monotonic()

        async def record(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, record)
        finally:
            log.info(
                "front.request",
                method=scope["method"],
                route=route_of(scope),
                status=status,
                ms=round((time.monotonic() - started) * 1000, 1),
            )


class Contained:
    """Outermost: an exception that gets here was answered 500 and logged, without its message,
    by `errors.on_unexpected` (Starlette raises it on regardless); uvicorn would log it again
    with its message and traceback, which may quote the request, so it ends here."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        with contextlib.suppress(Exception):
            await self.app(scope, receive, send)


class Front(Starlette):
    """The Starlette app with `Contained` around its whole stack."""

    def build_middleware_stack(self) -> ASGIApp:
        return Contained(super().build_middleware_stack())


def create_app(services: Services, parts: Sequence[FrontPart] | None = None) -> Starlette:
    """The front over `services` (which say where runs are stored and how they are published):
    the core routes and each of `parts` (by default every installed one, or the ones the
    deployment demands: `front/parts.py`)."""
    withhold_library_values()
    mounted = installed(demanded=services.settings.front_parts) if parts is None else parts
    routes = [*ROUTES, *(route for part in mounted for route in part.routes)]
    app = Front(routes=routes, exception_handlers=HANDLERS, middleware=[Middleware(AccessLog)])
    app.state.services = services
    app.state.metrics = registry_for(
        services.engine,
        services.redis,
        services.settings.namespace,
        named_tenants=services.settings.tenants.named,
    )
    for part in mounted:
        if part.setup is not None:
            part.setup(app, services)
    return app


def app_factory() -> Starlette:
    """For `uvicorn --factory front.app:app_factory`: this process's services, publishing run
    messages through the Celery app (built on first call, not at import)."""
    from tasks.services import services

    return create_app(services())
