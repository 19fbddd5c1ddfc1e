"""How a run is read: its id (in full, or a unique prefix), and its view (`RunView`: status,
counters, its answer opened with the seal keys and, when its agent declares an output type, the
answer's value as that type in a process that declares the agent (`output`), as the JSON it was
sealed as (`output_json`), or as any type asked for by name (`output_as`)). It needs Postgres
and the sealer only, not a process's services: the client's `get` reads through it, and so do
the CLI's `status` and `inspect`, which start without Redis, tool modules, Celery or pydantic
(runtime/entries/client.py re-exports it)."""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any, TypeVar

import sqlalchemy as sa

from runtime.base.refused import BadRequest
from runtime.base.sealing import NoSealKeys, Sealer, SealError
from runtime.flow.waiting import view_of
from store.errors import LiyagentError
from store.records import insert_audit_once
from store.rows import RunNotFound
from store.runs import get_run_used
from store.states import FINISHED
from store.usage import UsageTotals
from store.views import runs_by_id_prefix

if TYPE_CHECKING:
    from runtime.toolbox.tools import ToolRegistry

# The shortest run id prefix accepted (the demo prints 8 characters).
MIN_PREFIX = 4
# How many matches an ambiguous prefix lists.
PREFIX_MATCHES_SHOWN = 10
_HEX = re.compile(r"[0-9a-f]+")


T = TypeVar("T")


class OutputMismatch(LiyagentError, ValueError):
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
    # What a run waiting for capacity waits for, decoded from `waiting_on` (runtime/flow/
    # waiting.py): a model endpoint's (endpoint, reason closed or limited, limit, until), or
    # its tenant's turn (reason tenant, the tenant).
    waiting_for: dict[str, Any] | None = None
    # Whose share of the fleet it takes, and its priority (1 low, 2 normal, 3 high).
    tenant: str | None = None
    priority: int = 2
    # The tokens its written steps' responses reported, summed (store/usage.py): a step asked
    # again after a crash counts once, the one written; a step its provider reported no
    # usage for adds nothing. With their cost, what its lost attempts reserved for steps they
    # never wrote (`unconfirmed_*`, apart), and `with_children`: the same over the run and
    # every run it delegated to.
    usage: UsageTotals = field(default_factory=UsageTotals)

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
        import pydantic  # only a typed read needs it (the CLI's reads do not)

        from runtime.base.validation import described

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
        out["usage"] = self.usage.to_json()
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
    import pydantic  # a process that declares the agent has it loaded already

    from runtime.base.validation import described

    try:
        return declared.load(plain), None
    except pydantic.ValidationError as exc:
        said = described(exc, "(output)")
        return plain, (
            f"run {run_id}: its output does not fit {declared.name} as this process declares "
            f"it ({said}); `output` holds its JSON; read it with `output_as(...)` of the "
            "type the run was started with"
        )


def parse_id(raw: str, what: str = "run id") -> str:
    try:
        return str(uuid.UUID(str(raw)))
    except ValueError:
        raise BadRequest(f"{raw!r} is not a valid {what} (a UUID)") from None


def resolve_run_id(engine: sa.Engine, raw: str) -> str:
    """A full run id, or the one run a unique prefix of at least MIN_PREFIX hex digits names
    (the demo prints 8). No match: RunNotFound; several: BadRequest listing them."""
    text = raw.strip().lower()
    try:
        return parse_id(text)
    except BadRequest:
        pass
    digits = text.replace("-", "")
    if len(digits) < MIN_PREFIX or len(digits) > 32 or not _HEX.fullmatch(digits):
        raise BadRequest(
            f"{raw!r} is not a valid run id (a UUID) nor a prefix of one (at least {MIN_PREFIX} "
            "hex digits)"
        )
    with engine.connect() as conn:
        found = runs_by_id_prefix(conn, digits, PREFIX_MATCHES_SHOWN + 1)
    matches = [r for r in found if r.id.startswith(text)]
    if not matches:
        raise RunNotFound(raw)
    if len(matches) > 1:
        shown = ", ".join(f"{r.id} ({r.agent}, {r.status})" for r in matches[:PREFIX_MATCHES_SHOWN])
        more = " and more" if len(matches) > PREFIX_MATCHES_SHOWN else ""
        raise BadRequest(
            f"run id prefix {raw!r} is ambiguous: it matches {shown}{more}; give more of the id"
        )
    return matches[0].id


def read_view(
    engine: sa.Engine, sealer: Sealer, run_id: str, tools: ToolRegistry | None = None
) -> RunView:
    """The run as it stands (RunNotFound for an unknown one). Its answer is shown only when it
    verifies against its seal: one that does not is never shown, and is audited once as
    `agent.answer.unverified` (I6); without the seal keys, the view says so instead. With the
    process's `tools`, a typed output is read as the type they declare for its agent."""
    with engine.connect() as conn:
        row, used = get_run_used(conn, parse_id(run_id))
    answer, answer_error, output = None, None, None
    if row.answer is not None:
        try:
            opened = sealer.open(row.id, "answer", 0, row.answer)
            answer, output = str(opened["text"]), opened.get("output")
        except NoSealKeys as exc:
            answer_error = f"the answer is not shown: {exc}"
        except SealError as exc:
            answer_error = (
                "the stored answer does not verify against its seal; it is not shown and "
                "is never handed on (audited as agent.answer.unverified)"
            )
            with engine.connect() as conn:
                insert_audit_once(
                    conn,
                    run_id=row.id,
                    kind="agent.answer.unverified",
                    detail={"reason": str(exc), "status": row.status},
                )
    typed, output_error = (
        (output, None) if tools is None else read_as(tools, row.id, row.agent, output)
    )
    return RunView(
        row.id,
        row.status,
        row.attempt,
        row.lost_count,
        row.step,
        answer,
        row.failure_reason,
        row.waiting_on,
        answer_error,
        typed,
        output,
        output_error,
        view_of(row.waiting_on, row.tenant),
        row.tenant,
        row.priority,
        used,
    )
