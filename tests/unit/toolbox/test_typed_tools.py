"""Users' tools as typed functions: the schema and the validation come from the type hints
(pydantic), the description from the docstring; bad arguments are refused with what is wrong;
declarations that cannot be settled are refused at load, naming the module and the tool."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Iterator
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any

import pytest
from pydantic import BaseModel, Field
from structlog.testing import capture_logs

from liyagent import CallContext, InvalidArguments, ToolDeclarationError, ToolKind, agent, tool
from runtime.sending.call_http import CallHTTP
from runtime.toolbox.tool_sources import load_registry
from tests.support.user_modules import importable_root, write_module


class Priority(StrEnum):
    LOW = "low"
    HIGH = "high"


class Address(BaseModel):
    street: str
    city: str
    zip: Annotated[str, Field(pattern=r"^\d{5}$")]


class Refund(BaseModel):
    order: str
    amount_cents: int


@tool.keyed_write(name="refund.create", dedupe_window_s=86400)
def create_refund(
    ctx: CallContext,
    order: str,
    amount_cents: Annotated[int, Field(gt=0, description="in cents")],
    priority: Priority = Priority.LOW,
    ship_to: Address | None = None,
    tags: list[str] | None = None,
) -> Refund:
    """Refund an order.

    More text the model does not need.
    """
    return Refund(order=order, amount_cents=amount_cents)


def ctx_for(key: str = "k-1") -> CallContext:
    http = CallHTTP.for_call(key=key, run_id="r", attempt=1, call="1:c", timeout_s=5)
    return CallContext("r", 1, 1, "c", "refund.create", key, True, 5.0, http)


def test_the_schema_comes_from_the_hints_and_the_docstring() -> None:
    t = create_refund.to_tool("module tests")
    schema = t.schema()
    assert schema["name"] == "refund.create"
    assert schema["description"] == "Refund an order."
    params = schema["parameters"]
    assert params["required"] == ["order", "amount_cents"]
    assert params["additionalProperties"] is False
    props = params["properties"]
    assert props["amount_cents"] == {
        "description": "in cents",
        "exclusiveMinimum": 0,
        "title": "Amount Cents",
        "type": "integer",
    }
    assert "ctx" not in props
    # An enum and a nested model are described for the model, not flattened away.
    assert params["$defs"]["Priority"]["enum"] == ["low", "high"]
    assert params["$defs"]["Address"]["required"] == ["street", "city", "zip"]
    assert t.kind is ToolKind.KEYED_WRITE and t.dedupe_window_s == 86400


def test_valid_arguments_reach_the_function_typed() -> None:
    t = create_refund.to_tool("module tests")
    out = t.invoke(
        {
            "order": "o-1",
            "amount_cents": 1250,
            "priority": "high",
            "ship_to": {"street": "1 Main", "city": "X", "zip": "12345"},
        },
        ctx_for(),
    )
    assert out == {"order": "o-1", "amount_cents": 1250}


@pytest.mark.parametrize(
    ("args", "field", "says"),
    [
        ({"order": "o-1"}, "amount_cents", "Field required"),
        ({"order": "o-1", "amount_cents": -5}, "amount_cents", "greater than 0"),
        ({"order": "o-1", "amount_cents": "lots"}, "amount_cents", "valid integer"),
        ({"order": "o-1", "amount_cents": 5, "priority": "urgent"}, "priority", "'low' or"),
        (
            {"order": "o-1", "amount_cents": 5, "ship_to": {"street": "s", "city": "c"}},
            "ship_to.zip",
            "Field required",
        ),
        (
            {
                "order": "o-1",
                "amount_cents": 5,
                "ship_to": {"street": "s", "city": "c", "zip": "x"},
            },
            "ship_to.zip",
            "pattern",
        ),
        ({"order": "o-1", "amount_cents": 5, "note": "hi"}, "note", "Extra inputs"),
    ],
)
def test_bad_arguments_are_refused_saying_what_is_wrong(args, field, says) -> None:
    t = create_refund.to_tool("module tests")
    with pytest.raises(InvalidArguments) as info:
        t.validate(args)
    problems = {p["field"]: p["message"] for p in info.value.problems}
    assert field in problems and says in problems[field]
    told = info.value.outcome()
    assert told["error"] == "invalid arguments; the call was not made"


def test_async_tools_run_and_keep_their_loop_between_calls() -> None:
    loops: list[int] = []

    @tool.read
    async def slow_read(ctx: CallContext, n: int) -> dict[str, int]:
        """Read slowly."""
        await asyncio.sleep(0.01)
        loops.append(id(asyncio.get_running_loop()))
        return {"n": n * 2}

    t = slow_read.to_tool("module tests")
    assert t.invoke({"n": 2}, ctx_for()) == {"n": 4}
    assert t.invoke({"n": 3}, ctx_for()) == {"n": 6}
    assert len(set(loops)) == 1


def test_a_tool_without_a_context_and_plain_results() -> None:
    @tool.read(name="math.add")
    def add(a: int, b: int) -> int:
        """Add two numbers."""
        return a + b

    t = add.to_tool("module tests")
    assert t.invoke({"a": 2, "b": 3}, ctx_for()) == {"result": 5}
    assert add(2, 3) == 5  # still the plain function for the user's own tests


def test_a_reader_is_declared_next_to_its_write_and_gets_the_key() -> None:
    @tool.write(name="note.post")
    def post_note(ctx: CallContext, text: str) -> dict[str, Any]:
        """Post a note."""
        return {"text": text}

    @post_note.read_back
    def find_note(ctx: CallContext, text: str) -> dict[str, Any] | None:
        return {"found_by": ctx.key} if text == "seen" else None

    t = post_note.to_tool("module tests")
    assert t.reader is not None
    assert t.reader({"text": "seen"}, ctx_for("k-9")) == {"found_by": "k-9"}
    assert t.reader({"text": "other"}, ctx_for()) is None


def test_declarations_that_cannot_be_settled_are_refused() -> None:
    def send(amount: int) -> dict[str, int]:
        return {"amount": amount}

    with pytest.raises(ToolDeclarationError, match="dedupe window"):
        tool.keyed_write(send).to_tool("module m")
    with pytest.raises(ToolDeclarationError, match="tool send: unknown kind 'mutation'"):
        tool(kind="mutation")(send)
    with pytest.raises(ToolDeclarationError, match="engine's own"):
        tool(kind="delegation")(send)
    with pytest.raises(ToolDeclarationError, match="needs a type hint"):

        @tool.read
        def untyped(ctx: CallContext, x):  # type: ignore[no-untyped-def]
            """No hint."""

    with pytest.raises(ToolDeclarationError, match="only a write has a reader"):

        @tool.read
        def plain(ctx: CallContext, x: int) -> int:
            return x

        plain.read_back(lambda ctx, x: None)


@pytest.fixture
def user_package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A user's package outside the repository, importable like any installed module."""
    yield from importable_root(tmp_path, monkeypatch, "lyt_user")


def test_a_module_outside_the_repo_is_loaded_with_its_tools_and_agents(user_package) -> None:
    write_module(
        user_package,
        "lyt_user_tools",
        """
        from liyagent import CallContext, agent, tool

        @tool.read(name="orders.get")
        def get_order(ctx: CallContext, order: str) -> dict:
            '''Read an order.'''
            return {"order": order}

        support = agent("orders-bot", model={"provider": "openai", "model": "m"},
                        tools=[get_order], system="Be brief.")
        """,
    )
    registry = load_registry(["lyt_user_tools"], use_entry_points=False)
    assert registry.get("orders.get") is not None
    assert registry.get("orders.get").origin == "module lyt_user_tools"
    assert registry.get("agent.delegate") is not None  # the engine's own
    assert registry.agents["orders-bot"].tools == ["orders.get"]


@pytest.mark.parametrize(
    ("body", "says"),
    [
        ("raise RuntimeError('boom at import')", "failed to import (RuntimeError: boom at import"),
        ("x = 1", "declares no tools, agents, job kinds or workflows"),
        (
            """
            from liyagent import tool
            @tool.keyed_write(name="pay.send")
            def send(amount: int) -> dict:
                return {}
            """,
            "pay.send (module lyt_user_bad): a keyed write must declare its vendor's dedupe",
        ),
        (
            """
            from liyagent import tool
            @tool(kind="frobnicate")
            def odd(x: int) -> dict:
                return {}
            """,
            "module lyt_user_bad: tool odd: unknown kind 'frobnicate'",
        ),
    ],
)
def test_a_bad_module_stops_the_load_naming_module_and_tool(user_package, body, says) -> None:
    write_module(user_package, "lyt_user_bad", body)
    with pytest.raises(ToolDeclarationError) as info:
        load_registry(["lyt_user_bad"], use_entry_points=False)
    assert says in str(info.value)
    assert "lyt_user_bad" in str(info.value)


def test_a_tool_registered_twice_names_both_modules(user_package) -> None:
    for name in ("lyt_user_a", "lyt_user_b"):
        write_module(
            user_package,
            name,
            """
            from liyagent import tool
            @tool.read(name="dup.read")
            def read(x: int) -> dict:
                return {}
            """,
        )
    with pytest.raises(ToolDeclarationError) as info:
        load_registry(["lyt_user_a", "lyt_user_b"], use_entry_points=False)
    assert "dup.read is registered twice: by module lyt_user_a and by module lyt_user_b" in str(
        info.value
    )


def test_reclassification_is_checked(user_package) -> None:
    with pytest.raises(ToolDeclarationError, match="unknown tools"):
        load_registry([], kinds={"nope.tool": "read"}, use_entry_points=False)
    with pytest.raises(ToolDeclarationError, match="is not a kind"):
        load_registry([], kinds={"agent.delegate": "sometimes"}, use_entry_points=False)


def test_agents_declared_in_python_take_tool_objects_or_names() -> None:
    a = agent("a1", model={"provider": "openai", "model": "m"}, tools=[create_refund, "x.y"])
    assert a.tools == ["refund.create", "x.y"]


def test_a_tool_imported_by_another_module_is_loaded_once(user_package) -> None:
    write_module(
        user_package,
        "lyt_user_home",
        """
        from liyagent import tool
        @tool.read(name="home.read")
        def read(x: int) -> dict:
            return {}
        """,
    )
    write_module(
        user_package,
        "lyt_user_reuse",
        """
        from liyagent import tool
        from lyt_user_home import read  # reused, not declared again

        @tool.read(name="reuse.read")
        def other(x: int) -> dict:
            return {}
        """,
    )
    registry = load_registry(["lyt_user_home", "lyt_user_reuse"], use_entry_points=False)
    assert registry.get("home.read").origin == "module lyt_user_home"
    assert registry.get("reuse.read") is not None


@tool.read(name="doc.google")
def google_style(order: str, note: Annotated[str, Field(description="from the hint")] = "") -> dict:
    """Read an order.

    Args:
        order: The order's id,
            e.g. O-17.
        note: Not used: the type hint's own description wins.

    Returns:
        The order.
    """
    return {}


@tool.read(name="doc.numpy")
def numpy_style(order: str, limit: int = 5) -> dict:
    """Read an order.

    Parameters
    ----------
    order : str
        The order's id.
    limit : int
        At most this many lines.
    """
    return {}


@tool.read(name="doc.sphinx")
def sphinx_style(order: str, limit: int = 5) -> dict:
    """Read an order.

    :param order: The order's id.
    :param limit: At most this many lines.
    """
    return {}


@pytest.mark.parametrize("declared", [google_style, numpy_style, sphinx_style])
def test_args_sections_become_the_parameters_descriptions(declared) -> None:
    schema = declared.to_tool("module tests").schema()
    assert schema["description"] == "Read an order."
    props = schema["parameters"]["properties"]
    assert props["order"]["description"].startswith("The order's id")
    if "limit" in props:
        assert props["limit"]["description"] == "At most this many lines."
    if "note" in props:
        assert props["note"]["description"] == "from the hint"
    assert google_style.to_tool("t").schema()["parameters"]["properties"]["order"][
        "description"
    ] == ("The order's id, e.g. O-17.")


def test_a_tool_without_a_docstring_is_loaded_with_a_warning_naming_it(user_package) -> None:
    write_module(
        user_package,
        "lyt_user_nodoc",
        """
        from liyagent import tool

        @tool.read(name="nodoc.read")
        def read(x: int) -> dict:
            return {}

        @tool.read(name="doc.read")
        def documented(x: int) -> dict:
            '''Read x.'''
            return {}
        """,
    )
    with capture_logs() as logs:
        registry = load_registry(["lyt_user_nodoc"], use_entry_points=False)
    assert registry.get("nodoc.read") is not None
    warned = [e for e in logs if e["event"] == "tool.undocumented"]
    assert [(e["log_level"], e["tool"], e["origin"]) for e in warned] == [
        ("warning", "nodoc.read", "module lyt_user_nodoc")
    ]
    assert "docstring" in warned[0]["next"]


TWICE = """
from liyagent import agent, tool

@tool.write(name="twice.write")
def write(x: int) -> dict:
    '''Write x.'''
    return {}

bot = agent("twice-bot", model={"provider": "openai", "model": "m"}, tools=[write])
"""


def test_a_module_loaded_under_two_names_is_one(user_package, monkeypatch) -> None:
    package = user_package / "lyt_user_pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "lyt_user_twice.py").write_text(TWICE)
    monkeypatch.syspath_prepend(str(package))  # also importable as plain `lyt_user_twice`
    registry = load_registry(
        ["lyt_user_pkg.lyt_user_twice", "lyt_user_twice", "lyt_user_twice"],
        use_entry_points=False,
    )
    assert sys.modules["lyt_user_twice"] is not sys.modules["lyt_user_pkg.lyt_user_twice"]
    assert registry.get("twice.write") is not None
    assert registry.agents["twice-bot"].tools == ["twice.write"]
    # Reached once through a module and once through an entry point's list: one tool too.
    again = sys.modules["lyt_user_twice"].write.to_tool("entry point twice (liyagent.tools)")
    registry.register(again)
    assert registry.get("twice.write").origin == "module lyt_user_pkg.lyt_user_twice"


def test_two_functions_with_one_name_in_one_module_say_where_each_is(user_package) -> None:
    write_module(
        user_package,
        "lyt_user_same",
        """
        from liyagent import tool

        @tool.read(name="same.read")
        def one(x: int) -> dict:
            '''One.'''
            return {}

        @tool.read(name="same.read")
        def two(x: int) -> dict:
            '''Two.'''
            return {}
        """,
    )
    with pytest.raises(ToolDeclarationError) as info:
        load_registry(["lyt_user_same"], use_entry_points=False)
    message = str(info.value)
    assert "by module lyt_user_same and by module lyt_user_same (at " in message
    assert "lyt_user_same.py:4 and at " in message and "lyt_user_same.py:9)" in message


def test_an_agent_naming_a_tool_no_module_declares_stops_the_load(user_package) -> None:
    write_module(
        user_package,
        "lyt_user_agent",
        """
        from liyagent import agent

        bot = agent("typo-bot", model={"provider": "openai", "model": "m"},
                    tools=["agent.delegat"])
        """,
    )
    with pytest.raises(ToolDeclarationError) as info:
        load_registry(["lyt_user_agent"], use_entry_points=False)
    assert str(info.value) == (
        "agent typo-bot (module lyt_user_agent) names tools no module declares: agent.delegat; "
        "known: agent.delegate"
    )
