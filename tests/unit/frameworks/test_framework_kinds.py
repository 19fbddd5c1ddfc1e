"""The kinds and readers a team gives `durable(...)`, the same for every framework adapter (one
check in runtime/frameworks/calls.py, `check_named` and `write_reader`), run against each
adapter's own desk agent (tools `lookup` and `refund`, from its unit tests) so each is seen to
be wired in."""

from __future__ import annotations

from types import ModuleType

import pytest

from runtime.sending import traffic
from runtime.toolbox.tools import CallContext, ToolDeclarationError, ToolKind
from tests.unit.frameworks import test_openai_agents_adapter, test_pydantic_ai_adapter

ADAPTERS = {"pydantic-ai": test_pydantic_ai_adapter, "openai-agents": test_openai_agents_adapter}


@pytest.fixture(params=list(ADAPTERS))
def framework(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def adapter(framework: str) -> ModuleType:
    """The adapter's unit test module: its `durable`, `desk()` and `ctx_for`."""
    return ADAPTERS[framework]


def test_each_tool_gets_its_kind_schema_and_a_write_when_none(
    framework: str, adapter: ModuleType
) -> None:
    guest = adapter.durable(adapter.desk(), kinds={"lookup": "read"})
    tools = {t.name: t for t in guest.tools("here")}
    assert tools["desk.lookup"].kind is ToolKind.READ
    assert tools["desk.refund"].kind is ToolKind.WRITE
    assert tools["desk.refund"].parameters["required"] == ["order_id", "cents"]
    assert tools["desk.lookup"].description == "Look an order up."
    keyed = adapter.durable(adapter.desk(), kinds={"refund": "keyed_write:86400"})
    [refund] = [t for t in keyed.tools("here") if t.name == "desk.refund"]
    assert refund.kind is ToolKind.KEYED_WRITE and refund.dedupe_window_s == 86400
    assert guest.definition("here").model == {
        "provider": "framework",
        "framework": framework,
        "agent": "desk",
    }


@pytest.mark.parametrize(
    ("kinds", "said"),
    [
        ({"lookpu": "read"}, "kinds names tools the agent does not have: lookpu"),
        ({"lookup": "raed"}, "unknown kind 'raed'"),
        ({"refund": "keyed_write"}, "dedupe window in seconds"),
        ({"refund": "delegation"}, "unknown kind 'delegation'"),
        ({"lookup": "read:5"}, "only a keyed write takes a window"),
    ],
)
def test_a_bad_kinds_mapping_is_refused_at_declaration(
    framework: str, adapter: ModuleType, kinds: dict[str, str], said: str
) -> None:
    with pytest.raises(ToolDeclarationError, match=f"{framework} agent desk: .*{said}"):
        adapter.durable(adapter.desk(), kinds=kinds)


def test_a_write_may_have_a_reader_that_finds_it_by_its_key(adapter: ModuleType) -> None:
    def find_refund(ctx: CallContext, order_id: str, cents: int) -> dict[str, str] | None:
        return {"found": f"{ctx.key}:{order_id}"} if cents else None

    guest = adapter.durable(
        adapter.desk(), kinds={"lookup": "read"}, readers={"refund": find_refund}
    )
    [refund] = [t for t in guest.tools("here") if t.name == "desk.refund"]
    assert refund.reader is not None
    found = refund.reader({"order_id": "A", "cents": 3}, adapter.ctx_for("desk.refund"))
    assert found == {"found": "key-9:A"}
    with pytest.raises(ToolDeclarationError, match="readers names tools the agent does not have"):
        adapter.durable(adapter.desk(), readers={"refnud": find_refund})
    with pytest.raises(ToolDeclarationError, match="only a write"):
        adapter.durable(adapter.desk(), kinds={"lookup": "read"}, readers={"lookup": find_refund})


def test_every_tool_body_starts_after_the_lease_check_that_counts_it_sent(
    adapter: ModuleType,
) -> None:
    """LIYAGENT_TOOL_KINDS may make a tool declared a read a write: whatever its kind, its body
    (which may send with a client of its own) starts only after the lease check, and from then
    the call counts as possibly sent, so a write's error is in doubt, never a failure for
    certain (a read's doubt is only said)."""
    guest = adapter.durable(adapter.desk(), kinds={"lookup": "read"})
    [lookup] = [t for t in guest.tools("here") if t.name == "desk.lookup"]
    with traffic.watched() as seen:
        lookup.make({"order_id": "A"}, adapter.ctx_for("desk.lookup"))
    assert seen.left
