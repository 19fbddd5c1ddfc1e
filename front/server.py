"""Serving the front with uvicorn; `serve(host, port)` is the hook `liyagent serve` calls.

uvicorn serves with its h11 protocol bounded by `front/connections.py` (head and body time,
the connection cap) and the limits of `front/limits.py`, fitted to the process's file
descriptor limit, which is raised to its hard limit first.
"""

from __future__ import annotations

import asyncio
import logging
import socket

import structlog
import uvicorn

from front.auth import load_tokens
from front.connections import ConnectionGuard, UvicornNoise, protocol_for
from front.limits import FrontLimits, raise_fd_limit
from front.parts import installed
from runtime.base.extras import MissingExtra
from runtime.base.logs import configure
from runtime.base.settings import ConfigError
from runtime.ops import startup

log = structlog.get_logger("front")


class _AnnouncingServer(uvicorn.Server):
    """Prints `front listening on http://HOST:PORT` once its sockets listen (port 0 resolved);
    failed accepts are counted by the guard, not logged one traceback each.

    uvicorn's `backlog` is both the kernel's queue and how many sockets asyncio accepts in one
    loop turn; the front wants a long queue (a queued connection holds no descriptor) and a
    short round (an accepted one does), so it listens again with the queue's length."""

    def __init__(self, config: uvicorn.Config, guard: ConnectionGuard) -> None:
        super().__init__(config)
        self.guard = guard

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        asyncio.get_running_loop().set_exception_handler(self.guard.accept_failed)
        await super().startup(sockets=sockets)
        if not self.started or not self.servers:
            return
        for listening in self.servers[0].sockets:
            with listening.dup() as same:
                same.listen(self.guard.limits.backlog)
        bound = self.servers[0].sockets[0].getsockname()
        host = str(self.config.host)
        shown = f"[{host}]" if ":" in host else host
        print(f"front listening on http://{shown}:{bound[1]}", flush=True)

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        await super().shutdown(sockets=sockets)
        self.guard.refusals.flush()


def serve(host: str = "127.0.0.1", port: int = 8000) -> int:
    """Serve until SIGTERM or SIGINT (uvicorn drains, then ends the process with that signal);
    returns 2 at once when the settings are invalid, 1 if the server never started."""
    configure()
    try:
        settings = startup.check()  # seal keys, tools and MCP servers load first
        tokens = load_tokens(settings)
        fd_limit = raise_fd_limit()
        limits = FrontLimits.from_env().fitted(fd_limit)
        if settings.front_parts:  # a demanded part that cannot be served refuses the start
            installed(demanded=settings.front_parts)
    except (ConfigError, MissingExtra, startup.StartupRefused) as exc:
        log.error("front.bad_settings", error=str(exc), next="fix that and start again")
        return 2
    if not tokens.entries:
        log.warning(
            "front.no_token",
            error="no front token is configured: every endpoint but /healthz answers 503",
            next="set LIYAGENT_FRONT_TOKEN (or LIYAGENT_FRONT_TOKENS_FILE) and restart the front",
        )
    log.info(
        "front.limits",
        open_files=fd_limit,
        max_connections=limits.max_connections,
        backlog=limits.backlog,
        accept_batch=limits.accept_batch,
        head_timeout_s=limits.head_timeout_s,
        body_timeout_s=limits.body_timeout_s,
    )
    guard = ConnectionGuard(limits)
    config = uvicorn.Config(
        "front.app:app_factory",
        factory=True,
        host=host,
        port=port,
        access_log=False,
        http=protocol_for(guard),
        ws="none",  # the front serves no WebSockets; an Upgrade header is ignored
        backlog=limits.accept_batch,
    )
    logging.getLogger("uvicorn.error").addFilter(UvicornNoise(guard))
    server = _AnnouncingServer(config, guard)
    server.run()
    return 0 if server.started else 1
