"""A native agent's output type (runtime/models/output.py): declared with `agent(...,
output=...)`, offered to the model as the `final_result` tool, each final answer checked (by the
type itself, or by the schema sealed with the run) and refused, told to the model, when it does
not fit; read back by the app as the type (`RunView.output`, `output_as`), its JSON kept."""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from types import SimpleNamespace
from typing import Any, Literal

import pytest
from pydantic import BaseModel, field_validator

from liyagent import BadRequest, OutputMismatch, RunView, ToolDeclarationError, agent
from runtime.base.sealing import new_key_entry, parse_keys
from runtime.core.enqueue import checked_output
from runtime.durable.definition import IDENTITY, RunDefinition
from runtime.durable.state import ToolCall
from runtime.models import specs
from runtime.models.base import StepAnswer, StepRequest
from runtime.models.output import OUTPUT_TOOL, OutputType, TypedAnswers

MODEL = {"provider": "scripted", "script": {"steps": [{"final": "x"}]}}


class Triage(BaseModel):
    ticket: str
    severity: Literal["low", "high"]
    notes: list[str] = []

    @field_validator("ticket")
    @classmethod
    def _known(cls, ticket: str) -> str:
        if not ticket.startswith("T-"):
            raise ValueError("a ticket id starts with T-")
        return ticket


@dataclass
class Refund:
    order_id: str
    cents: int


class Answers:
    """A provider that answers each step with the next of `answers`, keeping what it was
    offered."""

    name = "test"

    def __init__(self, *answers: StepAnswer) -> None:
        self.answers = list(answers)
        self.offered: list[list[str]] = []

    def next_step(self, request: StepRequest) -> StepAnswer:
        self.offered.append([t["name"] for t in request.tools])
        return self.answers.pop(0)


def _ask(provider: TypedAnswers) -> StepAnswer:
    tool = {"name": "ticket.read", "description": "Read.", "parameters": {"type": "object"}}
    return provider.next_step(StepRequest("run-1", 1, 1, [], [tool]))


def _output(*args: dict[str, Any], **more: Any) -> StepAnswer:
    calls = [ToolCall(f"c{i}", OUTPUT_TOOL, a) for i, a in enumerate(args)]
    return StepAnswer(text=more.get("text"), calls=calls + more.get("calls", []))


def test_an_agent_declares_its_output_type() -> None:
    declared = agent("triage", model=MODEL, output=Triage)
    assert declared.output is not None and declared.output.declared is Triage
    assert declared.output_schema() == Triage.model_json_schema()
    assert agent("plain", model=MODEL).output is None
    assert agent("text", model=MODEL, output=str).output is None


@pytest.mark.parametrize(
    ("output", "tools", "said"),
    [
        ([Triage, Refund], None, "agent bad: output type .* is not a type"),
        (Triage, ["ticket.read", OUTPUT_TOOL], f"a tool named {OUTPUT_TOOL} cannot be offered"),
    ],
    ids=["not-one-type", "output-tool-named"],
)
def test_an_output_type_that_cannot_be_checked_is_refused_at_declaration(
    output: Any, tools: list[str] | None, said: str
) -> None:
    with pytest.raises(ToolDeclarationError, match=said):
        agent("bad", model=MODEL, tools=tools, output=output)


def test_a_final_answer_is_checked_by_the_type_itself() -> None:
    declared = OutputType.of(Triage)
    model = Answers(
        _output({"ticket": "T-7", "severity": "urgent"}),
        _output({"ticket": "7", "severity": "low"}),
        StepAnswer(text="It is fine.", calls=[]),
        _output({"ticket": "T-7", "severity": "low"}, calls=[ToolCall("c9", "ticket.read", {})]),
        StepAnswer(text=None, calls=[ToolCall("c1", OUTPUT_TOOL, {}, args_error="not JSON")]),
        StepAnswer(text=None, calls=[ToolCall("c2", "ticket.read", {"ticket": "T-7"})]),
        _output({"ticket": "T-7", "severity": "high"}),
    )
    typed = TypedAnswers(model, declared.schema, declared)
    wrong, unknown, text, beside, broken, tools, right = (_ask(typed) for _ in range(7))
    assert "severity" in (wrong.refused or "") and [c.name for c in wrong.calls] == [OUTPUT_TOOL]
    assert "starts with T-" in (unknown.refused or "")  # the type's own validator ran
    assert f"calling {OUTPUT_TOOL}, not as text" in (text.refused or "") and not text.calls
    assert "called alone" in (beside.refused or "") and len(beside.calls) == 2
    assert "not JSON" in (broken.refused or "")
    assert tools.calls[0].name == "ticket.read" and not tools.final
    assert right.final and right.output is not None
    assert right.output.value == {"ticket": "T-7", "severity": "high", "notes": []}  # defaults
    assert json.loads(right.text or "") == right.output.value
    assert model.offered[0] == ["ticket.read", OUTPUT_TOOL]


def test_without_the_declaration_the_sealed_schema_checks_the_answer() -> None:
    """A worker that does not declare the agent (or declares another type since) checks the
    answer against the schema the run started with."""
    schema = OutputType.of(Triage).schema
    changed = OutputType.of(Refund)
    model = Answers(
        _output({"ticket": "T-7", "severity": "urgent"}),
        _output({"ticket": "T-7", "severity": "low"}),
    )
    typed = TypedAnswers(model, schema, changed)
    wrong, right = _ask(typed), _ask(typed)
    assert "severity: 'urgent' is not one of" in (wrong.refused or "")
    assert right.output is not None and right.output.value == {"ticket": "T-7", "severity": "low"}


def test_a_scalar_output_is_wrapped_in_response() -> None:
    declared = OutputType.of(int)
    model = Answers(_output({"result": 3}), _output({"response": 3}))
    typed = TypedAnswers(model, declared.schema, None)
    assert typed.tool["parameters"]["required"] == ["response"]
    wrong, right = _ask(typed), _ask(typed)
    assert "response" in (wrong.refused or "")
    assert right.output is not None and right.output.value == 3


def _view(output: Any, plain: Any) -> RunView:
    return RunView("run-9", "succeeded", 1, 0, 2, "{}", None, output=output, output_json=plain)


def test_a_view_gives_its_output_as_a_type_and_as_json() -> None:
    plain = {"order_id": "A-1", "cents": 5}
    view = _view(Refund("A-1", 5), plain)
    assert view.output_as(Refund) == Refund("A-1", 5)
    assert view.output_as(dict) == plain
    assert view.to_json()["output"] == plain and "output_json" not in view.to_json()
    json.dumps(view.to_json())  # JSON whatever type `output` is
    with pytest.raises(OutputMismatch, match=r"run run-9: its output does not fit Triage"):
        view.output_as(Triage)
    with pytest.raises(OutputMismatch, match="run run-9 has no typed output"):
        _view(None, None).output_as(Refund)


RUN = "11111111-1111-1111-1111-111111111111"


def test_a_definition_carries_the_output_schema_and_stays_readable_without_one() -> None:
    """Format 2 adds `output`; a run without one is sealed as format 1 (no `output` key), as a
    worker of before it reads it."""
    sealer = parse_keys(new_key_entry("k1"))
    plain = RunDefinition("triage", "app", "plain", "agent", "api", None, None, RUN, True)
    typed = replace(plain, output=OutputType.of(Triage).schema)
    for definition, format_ in [(plain, 1), (typed, 2)]:
        sealed = definition.seal(sealer, RUN)
        payload = sealer.open(RUN, "definition", 0, sealed)
        assert payload["format"] == format_ and ("output" in payload) == (format_ == 2)
        row = SimpleNamespace(
            id=RUN, definition=sealed, **{n: getattr(definition, n) for n in IDENTITY}
        )
        assert RunDefinition.open(sealer, row) == definition  # type: ignore[arg-type]


def test_the_door_refuses_an_output_it_cannot_check() -> None:
    schema = OutputType.of(Triage).schema
    guest = specs.FrameworkSpec(framework="pydantic-ai", agent="desk")
    with pytest.raises(BadRequest, match="checks its answer against its own output type"):
        checked_output(guest, schema, [])
    scripted = specs.ScriptedSpec(script=MODEL["script"])
    with pytest.raises(BadRequest, match="no tool of that name"):
        checked_output(scripted, schema, ["ticket.read", OUTPUT_TOOL])
    with pytest.raises(BadRequest, match="output is a JSON Schema"):
        checked_output(scripted, [schema], [])
    checked_output(scripted, schema, ["ticket.read"])
