"""`LIYAGENT_MCP_SERVERS`: what is accepted, and what stops a process with what message."""

from __future__ import annotations

import json

import pytest

from runtime.toolbox.mcp_config import load_config
from runtime.toolbox.tools import ToolDeclarationError

SERVER = {"name": "orders", "url": "http://127.0.0.1:9000/mcp"}


def test_inline_json_a_file_and_a_bare_list_all_work(tmp_path) -> None:
    inline = load_config(json.dumps({"servers": [SERVER]}))
    path = tmp_path / "mcp.json"
    path.write_text(json.dumps([SERVER]))
    assert load_config(str(path)) == load_config(json.dumps([SERVER])) == inline
    assert load_config("") == []
    [server] = inline
    assert server.our_name("lookup") == "orders.lookup"
    assert server.headers() == {}


def test_overrides_prefix_and_renames() -> None:
    [server] = load_config(
        json.dumps(
            [
                {
                    **SERVER,
                    "prefix": "shop_",
                    "tools": {
                        "lookup": "read",
                        "refund": {"kind": "keyed_write", "dedupe_window_s": 3600},
                        "weird/name": {"name": "shop.weird"},
                    },
                }
            ]
        )
    )
    assert server.our_name("lookup") == "shop_lookup"
    assert server.our_name("weird/name") == "shop.weird"
    assert server.override("lookup").kind == "read"
    assert server.override("refund").dedupe_window_s == 3600
    assert server.override("other").kind is None


def test_the_auth_value_is_read_from_the_environment_at_use(monkeypatch) -> None:
    auth = {"header": "X-Api-Key", "env": "LYT_MCP_KEY", "scheme": None}
    [server] = load_config(json.dumps([{**SERVER, "auth": auth}]))
    monkeypatch.delenv("LYT_MCP_KEY", raising=False)
    with pytest.raises(ToolDeclarationError, match=r"LYT_MCP_KEY .* is not set"):
        server.headers()
    monkeypatch.setenv("LYT_MCP_KEY", "k-1")
    assert server.headers() == {"X-Api-Key": "k-1"}


@pytest.mark.parametrize(
    ("raw", "says"),
    [
        ("/nowhere/mcp.json", "cannot read the file"),
        ("{not json", "not valid JSON"),
        (json.dumps([{**SERVER, "token": "secret"}]), "servers.0.token: Extra inputs"),
        (json.dumps([{**SERVER, "url": "ftp://x"}]), "servers.0.url"),
        (json.dumps([SERVER, SERVER]), "servers named twice: ['orders']"),
        (json.dumps([{**SERVER, "tools": {"t": "delegation"}}]), "servers.0.tools.t"),
    ],
    ids=["missing-file", "bad-json", "unknown-key", "bad-url", "twice", "engine-kind"],
)
def test_a_bad_configuration_names_what_to_fix(raw, says) -> None:
    with pytest.raises(ToolDeclarationError) as info:
        load_config(raw)
    assert "LIYAGENT_MCP_SERVERS" in str(info.value)
    assert says in str(info.value)
