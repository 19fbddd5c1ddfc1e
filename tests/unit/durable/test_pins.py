"""A run's pin (runtime/durable/pins.py) against the code of another version: what it calls a
drift (a tool gone, its kind or argument schema changed, the agent's output type changed) and
what it does not (a tool's body or description changed), and its seal."""

from __future__ import annotations

from typing import Any

import pydantic
import pytest

from liyagent import CallContext, agent, tool
from runtime.base.sealing import SealError, parse_keys
from runtime.durable.pins import NewerFormat, Pin, Policy, structural
from runtime.toolbox.tools import ToolRegistry

SCRIPTED = {"provider": "scripted", "script": {"steps": [{"final": "ok"}]}}


def _code(
    *, refund_kind: str = "write", lookup_args: str = "order", output: Any = None
) -> ToolRegistry:
    """A registry as one version of a team's module would declare it."""

    if lookup_args == "order":

        def lookup(ctx: CallContext, order: str) -> dict[str, Any]:
            """Look an order up."""
            return {"order": order}
    else:

        def lookup(ctx: CallContext, order: str, region: str) -> dict[str, Any]:  # type: ignore[misc]
            """Look an order up in a region."""
            return {"order": order}

    def refund(ctx: CallContext, order: str) -> dict[str, Any]:
        """Refund an order."""
        return {"refunded": order}

    declare = tool.read if refund_kind == "read" else tool.write
    tools = [
        tool.read(name="desk.lookup")(lookup).to_tool("test"),
        declare(name="desk.refund")(refund).to_tool("test"),
    ]
    desk = agent("desk", model=SCRIPTED, tools=["desk.lookup"], output=output)
    return ToolRegistry(tools, agents=[desk])


class Answer(pydantic.BaseModel):
    order: str


class Answer2(pydantic.BaseModel):
    order: str
    refunded: bool


NAMES = ["desk.lookup", "desk.refund"]


def test_the_same_code_serves_its_pin() -> None:
    pin = Pin.of(_code(), "desk", NAMES)
    assert pin.drift(_code(), "desk") == []
    assert pin.id == Pin.of(_code(), "desk", NAMES).id


def test_a_schema_reworded_is_the_same_schema() -> None:
    said = {
        "type": "object",
        "title": "Args",
        "properties": {
            "order": {"type": "string", "description": "The order id"},
            "title": {"type": "string", "title": "Title"},
        },
        "required": ["order"],
    }
    reworded = {
        "type": "object",
        "properties": {
            "order": {"type": "string", "description": "Which order"},
            "title": {"type": "string"},
        },
        "required": ["order"],
    }
    assert structural(said) == structural(reworded)
    assert "title" in structural(said)["properties"], "a property named title is kept"
    assert structural(said) != structural({**reworded, "required": ["order", "title"]})


def test_each_change_that_would_serve_a_run_otherwise_is_a_drift() -> None:
    pin = Pin.of(_code(output=Answer), "desk", NAMES)
    gone = ToolRegistry(
        [t for t in (_code().get("desk.lookup"),) if t is not None],
        agents=[agent("desk", model=SCRIPTED, tools=None, output=Answer)],
    )
    assert [(d.name, d.change) for d in pin.drift(gone, "desk")] == [("desk.refund", "gone")]
    kind = pin.drift(_code(refund_kind="read", output=Answer), "desk")
    assert [(d.name, d.change, d.was, d.now) for d in kind] == [
        ("desk.refund", "kind", "write", "read")
    ]
    schema = pin.drift(_code(lookup_args="region", output=Answer), "desk")
    assert [(d.name, d.change) for d in schema] == [("desk.lookup", "schema")]
    output = pin.drift(_code(output=Answer2), "desk")
    assert [(d.what, d.change) for d in output] == [("output", "type")]
    assert "desk.refund is gone" in pin.drift(gone, "desk")[0].say()
    # Started where no output type was declared: not judged by one another code declares.
    assert Pin.of(_code(), "desk", NAMES).drift(_code(output=Answer), "desk") == []


def test_a_pin_is_sealed_with_its_run_and_a_newer_format_is_not_guessed_at() -> None:
    sealer = parse_keys("k1:" + "A" * 43 + "=")
    pin = Pin.of(_code(), "desk", NAMES, Policy.FOLLOW_LATEST)
    sealed = pin.seal(sealer, "run-1")
    assert Pin.open(sealer, "run-1", sealed) == pin
    with pytest.raises(SealError):
        Pin.open(sealer, "run-2", sealed)  # moved to another run
    newer = sealer.seal("run-1", "pin", 0, {"format": 99, **pin.to_json()})
    with pytest.raises(NewerFormat, match="newer than this worker reads"):
        Pin.open(sealer, "run-1", newer)
