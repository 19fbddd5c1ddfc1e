"""What an app reads of a run (`RunView`): its status, its answer and, when its agent declares
an output type, the answer's value as that type in a process that declares the agent
(`output`), as the JSON it was sealed as (`output_json`), or as any type asked for by name
(`output_as`)."""

from __future__ import annotations

import json
from dataclasses import dataclass, fields
from typing import Any, TypeVar

import pydantic

from runtime.base.validation import described
from runtime.toolbox.tools import ToolRegistry
from store.states import FINISHED

T = TypeVar("T")


class OutputMismatch(ValueError):
    """A run's output asked for as a type it does not fit, or a run with no typed output."""


@dataclass(frozen=True)
class RunView:
    id: str
    status: str
    attempt: int
    lost_count: int
    step: int
    answer: str | None
    failure_reason: str | None
    waiting_on: str | None = None
    # Set when the stored answer does not verify against its seal: it is not shown, never
    # handed on, and the finding is audited (I6).
    answer_error: str | None = None
    # The answer's value when its agent declares an output type (checked against that type by
    # the worker and sealed with the answer): an instance of that type when this process's
    # tool modules declare the agent (a pydantic model, a dataclass, ...), else its JSON.
    output: Any = None
    # The same value as the JSON it was sealed as (None without an output type).
    output_json: Any = None
    # Why `output` is only its JSON though this process declares the agent's type: the stored
    # value does not fit that type (the declaration changed since the run started).
    output_error: str | None = None

    @property
    def done(self) -> bool:
        return self.status in FINISHED

    def output_as(self, kind: type[T]) -> T:
        """The answer's value as `kind` (a pydantic model, dataclass, TypedDict, scalar...),
        validated from its JSON: whatever this process declares. OutputMismatch saying what
        does not fit, or that the run has no typed output (yet)."""
        if self.output_json is None:
            raise OutputMismatch(
                f"run {self.id} has no typed output (status {self.status}): an agent declares "
                "one with agent(..., output=...) or its framework's output_type; read "
                "`answer` for its text"
            )
        try:
            found: T = pydantic.TypeAdapter(kind).validate_json(json.dumps(self.output_json))
        except pydantic.ValidationError as exc:
            raise OutputMismatch(
                f"run {self.id}: its output does not fit {getattr(kind, '__name__', kind)} "
                f"({described(exc, '(output)')}); `output_json` holds it as stored"
            ) from None
        return found

    def to_json(self) -> dict[str, Any]:
        """The view as JSON (the front's `GET /runs/{id}`, the CLI's `--json`): `output` is
        the answer's value as it was sealed, whatever type this process reads it as."""
        out = {f.name: getattr(self, f.name) for f in fields(self) if f.name not in _AS_READ}
        out["output"] = self.output_json
        return out


# What only a Python reader of a view has: the value as its type, and why it is not.
_AS_READ = frozenset({"output_json", "output_error"})


def still_waiting(run_id: str, view: RunView, timeout_s: float) -> TimeoutError:
    """What a wait that ran out says: where the run stands."""
    return TimeoutError(
        f"run {run_id} still {view.status} after {timeout_s}s "
        f"(attempt {view.attempt}, lost {view.lost_count})"
    )


def read_as(tools: ToolRegistry, run_id: str, agent: str, plain: Any) -> tuple[Any, str | None]:
    """The answer's value `plain` as the type this process declares for `agent`, and why
    not when it does not fit (its JSON is then given as it is)."""
    declared = None if plain is None else tools.output_type(agent)
    if declared is None:
        return plain, None
    try:
        return declared.load(plain), None
    except pydantic.ValidationError as exc:
        said = described(exc, "(output)")
        return plain, (
            f"run {run_id}: its output does not fit {declared.name} as this process declares "
            f"it ({said}); `output` holds its JSON; read it with `output_as(...)` of the "
            "type the run was started with"
        )
