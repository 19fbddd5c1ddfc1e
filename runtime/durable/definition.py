"""A run's definition: everything a worker acts on for the run, sealed with it at enqueue.

Its model, tools, system prompt, entry details, workflow or job, and who it is (agent, owner,
the principal it acts as, its channel, kind, parent and correlation id) are sealed like a
checkpoint: AES-GCM with the run id bound in (purpose `definition`, step 0), so a database
writer can neither edit a waiting run's tools or model nor move a definition to another run.
The columns that repeat who it is (`runs.owner`, `runs.agent`, `runs.principal`, ...) serve
SQL (gates, reads scoped to a principal, lists, erasure by owner); a worker opens the
definition before anything else and refuses a run whose columns differ from it (I6): a
tampered row fails as a seal failure, audited, and nothing of it is made.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from runtime.base.sealing import Sealer, SealError, key_id
from runtime.durable import formats
from store.rows import RunRow

PURPOSE = "definition"
# The fields the run's row repeats as columns: each must equal its sealed value.
IDENTITY = (
    "agent",
    "owner",
    "entry_kind",
    "kind",
    "channel",
    "run_as",
    "parent_run_id",
    "correlation_id",
    "resumable",
    "principal",
)


@dataclass(frozen=True)
class RunDefinition:
    """What one run is: who it is, and what its attempts may use and do."""

    agent: str
    owner: str
    entry_kind: str
    kind: str
    channel: str
    run_as: str | None
    parent_run_id: str | None
    correlation_id: str
    resumable: bool
    # The front principal that started it (None inside the deployment): whose reads see it.
    principal: str | None = None
    # The model spec as the caller gave it (checked against the deployment's profiles at the
    # door and again by each worker before it calls).
    model: dict[str, Any] = field(default_factory=dict)
    # Exactly the tools the run may use (fail closed: none when none were given).
    tools: list[str] = field(default_factory=list)
    system: str | None = None
    may_wait: bool = True
    # Where the answer goes beyond the transcript (a Teams conversation, ...).
    entry: dict[str, Any] = field(default_factory=dict)
    workflow: dict[str, Any] | None = None
    job: dict[str, Any] | None = None
    # The run's trace context (W3C traceparent): every attempt's spans join this one trace.
    trace: dict[str, str] | None = None
    # The JSON schema of the type its final answer must be (runtime/models/output.py), checked
    # by the worker's loop; None: a text answer (or a framework agent, which checks its own).
    output: dict[str, Any] | None = None

    def seal(self, sealer: Sealer, run_id: str) -> bytes:
        """The sealed definition of run `run_id`."""
        fields = asdict(self)
        if fields["output"] is None:
            del fields["output"]
            return sealer.seal(run_id, PURPOSE, 0, {"format": 1, **fields})
        return sealer.seal(run_id, PURPOSE, 0, {"format": formats.DEFINITION.writes, **fields})

    @classmethod
    def open(cls, sealer: Sealer, row: RunRow) -> RunDefinition:
        """The run's definition, verified against its seal and its row; SealError (the run is
        then failed, never used: I6) when it does not verify, is missing, or its row's columns
        say otherwise. NewerFormat when newer code wrote it: the run is handed back, not failed
        (runtime/durable/formats.py)."""
        if row.definition is None:
            raise SealError(row.id, PURPOSE, "the run has no sealed definition")
        payload = sealer.open(row.id, PURPOSE, 0, row.definition)
        if not isinstance(payload, Mapping):
            raise SealError(row.id, PURPOSE, "its payload is not a run definition")
        try:
            formats.DEFINITION.check(row.id, payload.get("format"))
        except ValueError as exc:
            raise SealError(row.id, PURPOSE, str(exc)) from None
        fields = {k: v for k, v in payload.items() if k != "format"}
        try:
            definition = cls(**fields)
        except TypeError:
            raise SealError(row.id, PURPOSE, "its fields are not a run definition") from None
        for name in IDENTITY:
            column = getattr(row, name)
            if getattr(column, "value", column) != getattr(definition, name):
                raise SealError(row.id, PURPOSE, f"the run's {name} differs from its sealed one")
        return definition

    @classmethod
    def of_row(cls, row: RunRow) -> RunDefinition:
        """Only who the run is, from its row's columns: what an attempt knows of a run whose
        definition newer code sealed (runtime/durable/formats.py), enough to hand it back."""
        return cls(
            **{name: getattr(getattr(row, name), "value", getattr(row, name)) for name in IDENTITY}
        )

    @classmethod
    def of_legacy(cls, row: Mapping[str, Any]) -> RunDefinition:
        """The definition of a run stored before definitions were sealed (its `spec` JSON and
        its columns), for the migration that seals them (`liyagent db upgrade`)."""
        spec = dict(row.get("spec") or {})
        return cls(
            **{name: row[name] for name in IDENTITY},
            model=dict(spec.get("model") or {}),
            tools=list(spec.get("tools") or []),
            system=spec.get("system"),
            may_wait=bool(spec.get("may_wait", True)),
            entry=dict(spec.get("entry") or {}),
            workflow=spec.get("workflow"),
            job=spec.get("job"),
            trace=spec.get("trace"),
        )


def legacy_sealer(sealer: Sealer) -> Callable[[Mapping[str, Any]], bytes]:
    """What the sealing migration calls for each unfinished run stored with a plain `spec`:
    its row (id, spec and the identity columns) in, its sealed definition out."""

    def seal(row: Mapping[str, Any]) -> bytes:
        # The keys given must be the deployment's: a run's checkpoint was sealed with them.
        # Sealing its definition with another key (a shell's development key) would fail it.
        found = key_id(bytes(row["checkpoint"] or b""))
        if found is not None and found not in sealer.keys:
            raise RuntimeError(
                f"run {row['id']}'s checkpoint is sealed with key id {found!r}, which the keys "
                "given lack: run `liyagent db upgrade` with the deployment's LIYAGENT_SEAL_KEYS"
            )
        return RunDefinition.of_legacy(row).seal(sealer, str(row["id"]))

    return seal
