"""The configuration of MCP tool servers, `LIYAGENT_MCP_SERVERS`: the path of a JSON file, or
the JSON itself. Checked with pydantic, so a mistake stops the process with what to fix; the
SDK that talks to the servers lives in `mcp_tools.py`.

    {"servers": [{"name": "orders", "url": "http://127.0.0.1:9000/mcp",
                  "auth": {"header": "Authorization", "env": "ORDERS_MCP_TOKEN",
                           "scheme": "Bearer"},
                  "prefix": "orders.",
                  "tools": {"create_ticket": {"kind": "keyed_write", "dedupe_window_s": 86400},
                            "lookup": "read", "odd/name": {"name": "orders.odd"}}}]}
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Literal

import pydantic

from runtime.base.validation import described
from runtime.toolbox.tools import ToolDeclarationError

SETTING = "LIYAGENT_MCP_SERVERS"


class _Strict(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="forbid", frozen=True)


class AuthConfig(_Strict):
    """The auth header of a server: its value is read from the environment variable `env` at
    each use, never stored in the configuration or with a run."""

    header: str = "Authorization"
    env: str
    scheme: str | None = "Bearer"

    def value(self, server: str) -> str:
        secret = os.environ.get(self.env, "").strip()
        if not secret:
            raise ToolDeclarationError(
                f"{SETTING}: server {server}: the environment variable {self.env} (its auth "
                "header's value) is not set; set it in this process's environment"
            )
        return f"{self.scheme} {secret}" if self.scheme else secret


class ToolOverride(_Strict):
    """The operator's word on one tool: its kind (and a keyed write's dedupe window), and the
    name the model sees if the server's does not suit."""

    kind: Literal["read", "write", "keyed_write", "approval_write"] | None = None
    dedupe_window_s: float | None = None
    name: str | None = None


class ServerConfig(_Strict):
    """One MCP server: where it is, how to authenticate, and what to call its tools."""

    name: str = pydantic.Field(min_length=1)
    url: str = pydantic.Field(pattern=r"^https?://")
    auth: AuthConfig | None = None
    # Put before each tool's name (default: "<name>."), so two servers' tools never collide.
    prefix: str | None = None
    tools: dict[str, ToolOverride | Literal["read", "write", "keyed_write", "approval_write"]] = (
        pydantic.Field(default_factory=dict)
    )
    # How long the listing at start may take; a call's timeout is the engine's call timeout.
    timeout_s: float = pydantic.Field(default=10.0, gt=0)

    def override(self, tool: str) -> ToolOverride:
        found = self.tools.get(tool)
        if found is None:
            return ToolOverride()
        return ToolOverride(kind=found) if isinstance(found, str) else found

    def our_name(self, tool: str) -> str:
        renamed = self.override(tool).name
        if renamed:
            return renamed
        return f"{self.name}.{tool}" if self.prefix is None else f"{self.prefix}{tool}"

    def headers(self) -> dict[str, str]:
        return {} if self.auth is None else {self.auth.header: self.auth.value(self.name)}


class McpConfig(_Strict):
    servers: list[ServerConfig]


def load_config(raw: str) -> list[ServerConfig]:
    """The servers `LIYAGENT_MCP_SERVERS` configures: inline JSON, or the path of a JSON file.
    A bad configuration raises ToolDeclarationError saying what to fix."""
    text = raw.strip()
    if not text:
        return []
    if not text.startswith(("{", "[")):
        path = Path(text).expanduser()
        try:
            text = path.read_text()
        except OSError as exc:
            raise ToolDeclarationError(
                f"{SETTING}={raw!r}: cannot read the file ({exc.strerror}); give the path of a "
                "JSON file or the JSON itself"
            ) from None
    try:
        parsed = json.loads(text)
    except ValueError as exc:
        raise ToolDeclarationError(f"{SETTING}: not valid JSON ({exc})") from None
    if isinstance(parsed, list):
        parsed = {"servers": parsed}
    try:
        servers = McpConfig.model_validate(parsed).servers
    except pydantic.ValidationError as exc:
        raise ToolDeclarationError(f"{SETTING}: {described(exc, '(top)')}") from None
    names = [s.name for s in servers]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ToolDeclarationError(f"{SETTING}: servers named twice: {twice}")
    return servers
