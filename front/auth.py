"""Bearer-token auth: every endpoint but /healthz needs `Authorization: Bearer <token>`, the
token being LIYAGENT_FRONT_TOKEN; with none configured the front refuses, never opens."""

from __future__ import annotations

import hmac
from collections.abc import Awaitable, Callable

from starlette.requests import Request
from starlette.responses import Response

from front.errors import FrontError
from runtime.services import Services

Endpoint = Callable[[Request], Awaitable[Response]]
CHALLENGE = {"WWW-Authenticate": 'Bearer realm="liyagent"'}


def services(request: Request) -> Services:
    """The services this app was created with."""
    found: Services = request.app.state.services
    return found


def check_bearer(request: Request, token: str) -> None:
    """Compare the presented token in constant time; 503 when none is configured."""
    if not token:
        raise FrontError(
            503,
            "the front has no token configured, so it refuses every request; "
            "set LIYAGENT_FRONT_TOKEN and restart it",
        )
    scheme, _, given = request.headers.get("authorization", "").partition(" ")
    valid = scheme.lower() == "bearer" and hmac.compare_digest(
        given.strip().encode("utf-8"), token.encode("utf-8")
    )
    if not valid:
        raise FrontError(
            401,
            "missing or wrong bearer token; send Authorization: Bearer <LIYAGENT_FRONT_TOKEN>",
            headers=CHALLENGE,
        )


def protected(endpoint: Endpoint) -> Endpoint:
    """The endpoint, run only for a request carrying the configured bearer token."""

    async def guarded(request: Request) -> Response:
        check_bearer(request, services(request).settings.front_token)
        return await endpoint(request)

    guarded.__name__ = endpoint.__name__
    guarded.__doc__ = endpoint.__doc__
    return guarded
