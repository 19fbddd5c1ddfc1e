"""Serving the front with uvicorn; `serve(host, port)` is the hook `liyagent serve` calls."""

from __future__ import annotations

import socket

import structlog
import uvicorn

from front.auth import load_tokens
from runtime.base.logs import configure
from runtime.base.settings import ConfigError
from runtime.ops import startup

log = structlog.get_logger("front")


class _AnnouncingServer(uvicorn.Server):
    """Prints `front listening on http://HOST:PORT` once its sockets listen (port 0 resolved)."""

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets=sockets)
        if not self.started or not self.servers:
            return
        bound = self.servers[0].sockets[0].getsockname()
        host = str(self.config.host)
        shown = f"[{host}]" if ":" in host else host
        print(f"front listening on http://{shown}:{bound[1]}", flush=True)


def serve(host: str = "127.0.0.1", port: int = 8000) -> int:
    """Serve until SIGTERM or SIGINT (uvicorn drains, then ends the process with that signal);
    returns 2 at once when the settings are invalid, 1 if the server never started."""
    configure()
    try:
        tokens = load_tokens(startup.check())  # seal keys, tools and MCP servers load first
    except (ConfigError, startup.StartupRefused) as exc:
        log.error("front.bad_settings", error=str(exc), next="fix that and start again")
        return 2
    if not tokens.entries:
        log.warning(
            "front.no_token",
            error="no front token is configured: every endpoint but /healthz answers 503",
            next="set LIYAGENT_FRONT_TOKEN (or LIYAGENT_FRONT_TOKENS_FILE) and restart the front",
        )
    config = uvicorn.Config(
        "front.app:app_factory", factory=True, host=host, port=port, access_log=False
    )
    server = _AnnouncingServer(config)
    server.run()
    return 0 if server.started else 1
