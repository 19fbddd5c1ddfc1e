"""A run's pin (runtime/durable/pins.py) against the code of another version: what it calls a
drift (a tool gone, its kind or argument schema changed, the agent's output type changed) and
what it does not (a tool's body or description changed), the instructions it keeps, and its
seal; the formats of a run's records (runtime/durable/formats.py)."""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

import pydantic
import pytest

from liyagent import CallContext, agent, tool
from runtime.base.sealing import SealError, parse_keys
from runtime.core.code_versions import pinned_model
from runtime.durable import formats
from runtime.durable.definition import IDENTITY, RunDefinition
from runtime.durable.pins import (
    Instructions,
    NewerFormat,
    Pin,
    PinnedModel,
    Policy,
    code_version,
    structural,
)
from runtime.durable.state import RunState
from runtime.models import profiles
from runtime.toolbox.tools import ToolRegistry

SCRIPTED = {"provider": "scripted", "script": {"steps": [{"final": "ok"}]}}


def _code(
    *,
    refund_kind: str = "write",
    lookup_args: str = "order",
    output: Any = None,
    system: str | None = None,
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
    desk = agent("desk", model=SCRIPTED, tools=["desk.lookup"], output=output, system=system)
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


def test_a_native_agents_declared_prompt_is_pinned_when_its_run_starts_with_it() -> None:
    old, new = _code(system="Be brief."), _code(system="Be thorough.")
    pin = Pin.of(old, "desk", NAMES, system="Be brief.")
    assert pin.instructions == Instructions("Be brief.", per_request=False)
    # A pinned run is served through a changed prompt (it keeps its own: runtime/core/drift.py
    # drops the change); one that follows the latest takes the new one.
    [change] = pin.drift(new, "desk")
    assert (change.what, change.change) == ("agent", "instructions")
    assert Pin(Policy.FOLLOW_LATEST, pin.tools, None, pin.instructions).latest(
        new, "desk", NAMES
    ).instructions == Instructions("Be thorough.", per_request=False)
    # A run started with a prompt of its caller's own: no code changes it, none is pinned.
    own = Pin.of(old, "desk", NAMES, Policy.FOLLOW_LATEST, system="My own prompt.")
    assert own.instructions is None and own.drift(new, "desk") == []
    assert own.latest(new, "desk", NAMES).instructions is None


def test_a_pin_with_instructions_is_a_newer_format_and_one_without_is_not() -> None:
    sealer = parse_keys("k1:" + "A" * 43 + "=")
    plain = Pin.of(_code(), "desk", NAMES)
    said = Pin.of(_code(system="Be brief."), "desk", NAMES, system="Be brief.")
    assert sealer.open("run-1", "pin", 0, plain.seal(sealer, "run-1"))["format"] == 1
    assert sealer.open("run-1", "pin", 0, said.seal(sealer, "run-1"))["format"] == 2
    assert Pin.open(sealer, "run-1", said.seal(sealer, "run-1")) == said


def test_a_record_of_a_newer_format_is_handed_back_and_an_unknown_one_is_refused() -> None:
    state = RunState.initial("desk", None, "hi")
    with pytest.raises(NewerFormat, match="step record is of format 3"):
        state.apply({"v": 3}, "run-1")
    with pytest.raises(NewerFormat, match="checkpoint is of format 2"):
        RunState.from_payload({**state.to_payload(), "v": 2}, "run-1")
    for unknown in (0, "2", None, True):
        with pytest.raises(ValueError, match="not one this worker reads"):
            formats.STEP_RECORD.check("run-1", unknown)
    # NewerFormat is never taken for an unreadable record (nothing catching ValueError).
    assert not issubclass(NewerFormat, ValueError)


def test_a_definition_of_a_newer_format_is_handed_back() -> None:
    sealer = parse_keys("k1:" + "A" * 43 + "=")
    run = "11111111-1111-1111-1111-111111111111"
    definition = RunDefinition("desk", "app", "api", "agent", "api", None, None, run, True)
    identity = {n: getattr(definition, n) for n in IDENTITY}
    newer = sealer.seal(run, "definition", 0, {"format": 3, **identity})
    row = SimpleNamespace(id=run, definition=newer, **identity)
    with pytest.raises(NewerFormat, match="definition is of format 3"):
        RunDefinition.open(sealer, row)  # type: ignore[arg-type]
    # What the attempt knows of it: who it is, from its row.
    assert RunDefinition.of_row(row) == definition  # type: ignore[arg-type]


def test_a_code_version_names_all_the_code_declares() -> None:
    assert code_version(_code()) == code_version(_code())
    assert code_version(_code(refund_kind="read")) != code_version(_code())
    assert code_version(_code(system="Be brief.")) != code_version(_code())
    # A pin names the version that pinned it, not in its id: the same definition version.
    old, new = Pin.of(_code(), "desk", NAMES), Pin.of(_code(system="Be brief."), "desk", NAMES)
    assert old.code != new.code and old.id == new.id


def test_a_run_is_offered_only_the_tools_it_is_pinned_to() -> None:
    pin = Pin.of(_code(), "desk", ["desk.lookup"])
    assert pin.offered(["desk.lookup", "desk.refund"]) == ["desk.lookup"]


def _profiles(default: str) -> dict[str, Any]:
    """The deployment's one profile, whose default model is `default`."""
    said = {"provider": "openai", "base_url": "https://models.example/v1"}
    said.update(api_key_env="DESK_KEY", model=default)
    return profiles.parse(json.dumps({"desk": said}))


def test_a_profiles_default_model_is_pinned_and_asked_whatever_the_profile_says_now() -> None:
    spec = {"provider": "openai", "profile": "desk"}
    asked = pinned_model(spec, _profiles("small-1"), _code(), "desk")
    assert asked == PinnedModel("small-1", served=True)
    pin = Pin.of(_code(), "desk", NAMES, model=asked)
    now = pinned_model(spec, _profiles("large-2"), _code(), "desk")
    [change] = pin.drift(_code(), "desk", now)
    assert (change.change, change.was, change.now) == ("model", "small-1", "large-2")
    # Pinned: served, asking the model it pinned; following the latest: the new default.
    assert pin.unserved(_code(), "desk", now) == []
    assert pin.asked(spec) == {**spec, "model": "small-1"}
    follower = Pin(Policy.FOLLOW_LATEST, pin.tools, model=asked)
    assert follower.latest(_code(), "desk", NAMES, now).model == now
    # A spec that names its model keeps it in its definition: nothing of the profile pinned.
    assert pinned_model({**spec, "model": "mine"}, _profiles("small-1"), _code(), "desk") is None


def test_a_framework_agent_with_no_instructions_is_pinned_to_none() -> None:
    from pydantic_ai import Agent
    from pydantic_ai.models.test import TestModel

    from liyagent.adapters.pydantic_ai import durable
    from runtime.models.base import StepRequest

    bare = durable(Agent(TestModel(), name="g"))
    told = durable(Agent(TestModel(), name="g", instructions="Be brief."))
    pin = Pin.of(ToolRegistry(guests=[bare]), "g", [])
    assert pin.instructions == Instructions("", per_request=True)
    # A deploy that gives it instructions changes what its runs are asked with: a drift.
    [change] = pin.drift(ToolRegistry(guests=[told]), "g")
    assert (change.what, change.change) == ("agent", "instructions")
    # Asked with none, whatever the code says now.
    asked = StepRequest("run-1", 1, 1, [], [], instructions=pin.instructions.text)
    assert told.instructions_for(asked) is None


def test_a_deployment_version_names_the_profiles_default_models() -> None:
    from runtime.core.code_versions import deployment_version

    code = _code()
    small, large = _profiles("small-1"), _profiles("large-2")
    assert deployment_version(code, small) == deployment_version(code, _profiles("small-1"))
    assert deployment_version(code, small) != deployment_version(code, large)
