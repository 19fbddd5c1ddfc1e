"""The fleet's Lua scripts, one file each: every script a lease operation runs exists, and its
header (its leading comment) names every key and argument its body uses, so a reader learns
what a script touches from its first lines (STYLE: dramatiq's documented scripts)."""

from __future__ import annotations

import re
from importlib.resources import files

import pytest

from runtime.fleet.scripts import NAMES, source

LUA = files("runtime.fleet") / "lua"


def _header_and_body(name: str) -> tuple[str, str]:
    lines = (LUA / f"{name}.lua").read_text().splitlines()
    header = [line for line in lines if line.startswith("--")]
    body = [line for line in lines if not line.startswith("--")]
    return "\n".join(header), "\n".join(body)


@pytest.mark.parametrize("name", [*NAMES, "witness"])
def test_every_key_and_argument_a_script_uses_is_in_its_header(name: str) -> None:
    header, body = _header_and_body(name)
    assert header, f"lua/{name}.lua has no header"
    used = set(re.findall(r"\b(KEYS|ARGV)\[(\d+)\]", body))
    # A script over a list of keys or arguments says so as a whole (`KEYS = the lease keys`).
    listed = {kind for kind in ("KEYS", "ARGV") if re.search(rf"\b{kind} = ", header)}
    for kind, n in sorted(used):
        assert f"{kind}[{n}]" in header or kind in listed, (
            f"lua/{name}.lua uses {kind}[{n}] without naming it in its header"
        )


def test_a_script_that_moves_a_witness_carries_its_function() -> None:
    for name in ("renew", "release"):
        assert source(name).startswith(source("witness"))
        assert "witness(" in _header_and_body(name)[1]
    assert "local function witness" not in source("acquire")
