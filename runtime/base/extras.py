"""What an optional part of liyagent needs installed, said in one place: each extra of
pyproject.toml (`pip install 'liyagent[front]'`), the modules that need it, and the clear error
a process meets when one is missing (`MissingExtra`, naming the extra), instead of an
ImportError from deep inside."""

from __future__ import annotations

import importlib
from types import ModuleType

from store.errors import LiyagentError

# Each extra, and what it brings (said in the message when it is missing).
EXTRAS = {
    "front": "the HTTP front (webhooks, runs, approvals, SSE): starlette, uvicorn, sse-starlette",
    "teams": "Teams through the Bot Framework: pyjwt (the channel's tokens)",
    "a2a": "A2A, the front's JSON-RPC binding and the remote.ask tool: a2a-sdk",
    "mcp": "MCP servers as tool sources: mcp",
    "anthropic": "the Anthropic Messages API provider: anthropic",
    "flower": "Flower, to watch workers: flower",
    "reports": "the timeline pictures and charts (inspect --png, trials, bench): matplotlib",
}

# liyagent's own top-level packages (pyproject.toml [tool.setuptools] packages): a module of
# these that cannot be found is a bug or a broken install, never a missing extra.
OWN_PACKAGES = frozenset({"front", "liyagent", "runtime", "simulators", "store", "tasks"})


class MissingExtra(LiyagentError, ImportError):
    """An optional part was asked for whose extra is not installed."""

    def __init__(self, extra: str, missing: str) -> None:
        super().__init__(
            f"{EXTRAS[extra]} is not installed ({missing} cannot be imported): install it "
            f"with pip install 'liyagent[{extra}]' (or 'liyagent[all]')"
        )
        self.extra = extra


def need(extra: str, module: str) -> ModuleType:
    """`module`, which needs `extra`; MissingExtra naming the extra when its packages are not
    installed (an ImportError of one of our own modules is not hidden)."""
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as exc:
        if exc.name is None or exc.name.partition(".")[0] in OWN_PACKAGES:
            raise  # our own module is missing (a typo, a broken install), not an extra
        raise MissingExtra(extra, exc.name) from None
