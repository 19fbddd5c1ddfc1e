"""The seam a framework agent plugs in at (runtime/toolbox/guests.py): a guest held at a tool
module's top level registers its tools, its definition and itself; its runs' model spec names
it and nothing else; a final answer refused for its type is written with the model told."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from runtime.durable.state import RunState, ToolCall
from runtime.models import specs
from runtime.models.profiles import BUILT_IN
from runtime.toolbox.tool_sources import load_registry
from runtime.toolbox.tools import ToolDeclarationError
from tests.support.user_modules import importable_root, write_module

GUEST = """
from runtime.models.base import StepAnswer
from runtime.toolbox.guests import GuestAgent, guest_tool_name
from runtime.toolbox.tools import Tool, ToolKind


class Echo:
    name = "echo"

    def next_step(self, request):
        return StepAnswer(text="hi", calls=[])


class Toy(GuestAgent):
    framework = "toy"

    def tools(self, origin):
        return [
            Tool(guest_tool_name(self.name, "look"), ToolKind.READ, "Look.", lambda a, c: {},
                 origin=origin)
        ]

    def provider(self):
        return Echo()


toy = Toy("{name}")
"""


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    yield from importable_root(tmp_path, monkeypatch, "guestmod")


def test_a_guest_registers_its_tools_definition_and_itself(home: Path) -> None:
    write_module(home, "guestmod_a", GUEST.replace("{name}", "helper"))
    registry = load_registry(["guestmod_a"], use_entry_points=False)
    assert registry.guests["helper"].framework == "toy"
    assert registry.get("helper.look") is not None
    definition = registry.agents["helper"]
    assert definition.tools == ["helper.look"]
    assert definition.model == {"provider": "framework", "framework": "toy", "agent": "helper"}
    assert isinstance(specs.check(definition.model, BUILT_IN), specs.FrameworkSpec)


def test_two_guests_of_one_name_are_refused(home: Path) -> None:
    write_module(home, "guestmod_b", GUEST.replace("{name}", "same"))
    write_module(home, "guestmod_c", GUEST.replace("{name}", "same"))
    with pytest.raises(ToolDeclarationError, match="twice"):
        load_registry(["guestmod_b", "guestmod_c"], use_entry_points=False)


@pytest.mark.parametrize(
    "spec",
    [
        {"provider": "framework", "agent": "x"},
        {"provider": "framework", "framework": "toy", "agent": "has space"},
        {"provider": "framework", "framework": "toy", "agent": "x", "code": "import os"},
    ],
)
def test_a_framework_spec_names_the_guest_and_nothing_else(spec: dict[str, str]) -> None:
    with pytest.raises(specs.ModelSpecError, match="framework model spec"):
        specs.check(spec, BUILT_IN)


def test_a_refused_answer_is_a_step_with_the_model_told_why() -> None:
    state = RunState.initial("agent", None, "help")
    state.mark_written(b"d0")
    call = ToolCall("call_out", "final_result", {"answer": 3})
    state.take_refused(None, [call], "answer: not a string", attempt=1)
    assert state.step == 1 and state.calls == []
    assert state.count_of("refused_answers") == 1
    told = state.messages[-1]
    assert told["role"] == "tool" and told["tool_call_id"] == "call_out" and told["retry"]
    assert "answer: not a string" in told["content"]
    # What the step record seals rebuilds the same state (a resume asks only step 2).
    again = RunState.initial("agent", None, "help")
    again.mark_written(b"d0")
    again.apply(state.delta())
    assert again.messages == state.messages and again.step == 1
    text_only = RunState.initial("agent", None, "help")
    text_only.take_refused("not json", [], "the answer is not JSON", attempt=1)
    assert text_only.messages[-1] == {
        "role": "user",
        "content": "the answer is not JSON",
        "retry": True,
    }
