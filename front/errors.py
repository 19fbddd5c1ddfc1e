"""Errors the front answers with: one JSON shape, `{"error": ...}`, with the run id where one
is known, so every refusal says what went wrong and what to do next."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import structlog
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response
from starlette.types import Scope

from runtime.base.redact import error_facts, frames
from runtime.core.enqueue import BadRequest, RequestConflict
from store.rows import RunNotFound

log = structlog.get_logger("front")


class FrontError(Exception):
    """A refusal with its HTTP status; raised before anything is stored."""

    def __init__(
        self, status: int, message: str, *, headers: dict[str, str] | None = None, **extra: Any
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.headers = headers
        self.extra = extra


def route_of(scope: Scope) -> str:
    """The matched route's template (`/runs/{run_id}`), never the request's path: a refused
    path's values (and any path's) stay out of the log."""
    path = getattr(scope.get("route"), "path", None)
    return path if isinstance(path, str) else "unmatched"


def _where(exc: Exception) -> str:
    """Where a refusal was raised: the check that refused, not the value it refused."""
    return str(error_facts(exc).get("where", ""))


def error_response(
    status: int, message: str, headers: Mapping[str, str] | None = None, **extra: Any
) -> JSONResponse:
    return JSONResponse({"error": message, **extra}, status_code=status, headers=headers)


async def on_front_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, FrontError)
    # The message goes to the client only: it may quote what was refused.
    log.info("front.refused", route=route_of(request.scope), status=exc.status, at=_where(exc))
    return error_response(exc.status, exc.message, exc.headers, **exc.extra)


async def on_bad_request(request: Request, exc: Exception) -> Response:
    """The runtime refused the input (it stores nothing when it does)."""
    log.info("front.refused", route=route_of(request.scope), status=400, at=_where(exc))
    return error_response(400, str(exc))


async def on_request_conflict(request: Request, exc: Exception) -> Response:
    """The request key already names one of this principal's runs, started with another
    request: 409 with that run, and nothing of the request that started it (nothing stored)."""
    assert isinstance(exc, RequestConflict)
    log.info("front.refused", path=request.url.path, status=409, run_id=exc.run_id)
    return error_response(409, str(exc), run_id=exc.run_id)


async def on_run_not_found(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, RunNotFound)
    return error_response(404, str(exc), run_id=exc.run_id)


async def on_http_error(request: Request, exc: Exception) -> Response:
    """Unknown routes (404) and wrong methods (405, keeping its Allow header) as JSON."""
    assert isinstance(exc, HTTPException)
    if exc.status_code == 404:
        message = f"no endpoint at {request.url.path}; check the path"
    elif exc.status_code == 405:
        message = f"{request.method} is not allowed on {request.url.path}"
    else:
        message = str(exc.detail)
    return error_response(exc.status_code, message, exc.headers)


async def on_client_gone(request: Request, exc: Exception) -> Response:
    """The client left (or was cut off by the body bound, front/connections.py, which counts
    it) before its request was whole: nothing to answer and nothing to log per request."""
    return Response(status_code=408)


async def on_unexpected(request: Request, exc: Exception) -> Response:
    """Anything else: logged with where it was raised but never its message, which may carry
    the caller's text; the caller may retry (entries are keyed)."""
    log.error("front.failed", route=route_of(request.scope), **error_facts(exc), frames=frames(exc))
    return error_response(
        500,
        f"internal error ({type(exc).__name__}); retrying with the same ids is safe, "
        "and the front's log has the details",
    )


HANDLERS: dict[Any, Any] = {
    FrontError: on_front_error,
    RequestConflict: on_request_conflict,
    BadRequest: on_bad_request,
    RunNotFound: on_run_not_found,
    HTTPException: on_http_error,
    ClientDisconnect: on_client_gone,
    Exception: on_unexpected,
}
