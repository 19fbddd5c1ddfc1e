"""The fleet's Lua scripts, each in a file of its own under `lua/` whose header says every key
and argument it takes and what it keeps atomic; read once per process. Scripts that move a
run's step witness have `witness.lua`'s function put in front of them."""

from __future__ import annotations

from functools import cache
from importlib.resources import files

# The scripts that call witness() (lua/witness.lua).
_WITH_WITNESS = frozenset({"renew", "release"})
# Every script the lease operations run, registered once per client (runtime/fleet/base.py).
NAMES = (
    "acquire",
    "renew",
    "release",
    "renew_or_take_back",
    "reserve",
    "unwatch",
    "take_dead",
    "take_token",
    "lapsed",
    "fence_missing",
    "unfence",
    "let_go",
    "epoch",
    "epoch_mark",
    "reached",
    "others_reached",
)


@cache
def source(name: str) -> str:
    """The Lua source of script `name` (with witness() in front where it calls it)."""
    text = (files("runtime.fleet") / "lua" / f"{name}.lua").read_text()
    return source("witness") + text if name in _WITH_WITNESS else text
