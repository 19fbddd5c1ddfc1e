"""`liyagent deploy check`: which runs in flight, waiting or queued the code this process runs
would not serve as they started, and why. Run it with the new code, against the deployment's
Postgres and seal keys, before a rolling deploy hands those runs to that code.

What a run keeps and what the code serves (docs/deploy.md, "What a deploy changes under runs
in flight"): its definition is sealed when it starts (its model spec, the names of its tools,
its system prompt, its output schema); the code gives its tools, framework agents, job kinds and
model endpoints. So a run *fails* on the new code when its definition does not open there (a
format that code does not read, a seal key it lacks), when its model names an endpoint the new
deployment does not declare or a framework agent it does not register, or when it is a job of
a kind the code does not declare. A run started with a pin (runtime/durable/pins.py) whose
tools' kinds or argument schemas, or whose agent's output type, the code no longer declares
as pinned waits for a worker that does and fails once none remains (its agent's policy
`pinned`; changed instructions serve it, by its pinned text), or is re-pinned to the code and
*drifts* (`follow_latest`, instructions included). A run stored before pins
*drifts* when a tool it was given is gone: the model is no longer offered it, and a call to it
is refused.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

import sqlalchemy as sa

from runtime.base.sealing import Sealer, SealError
from runtime.core.code_versions import pinned_model
from runtime.durable.definition import RunDefinition
from runtime.durable.pins import NewerFormat, Pin, Policy
from runtime.models import specs
from runtime.models.base import ModelError
from runtime.models.profiles import ModelProfile
from runtime.toolbox.tools import ToolRegistry
from store.rows import RunRow
from store.runs import FIRST_ID, live_runs_after

# Live runs read and judged a page at a time (one indexed read each, no lock held).
PAGE = 1000

# A record newer than this code reads: an older worker never fails it, it waits for one that
# reads it, and none would once this code is all there is (a rollback).
NOT_READ = "it would wait for a worker that reads it, and none would once the deploy is done"


class Verdict(StrEnum):
    """What the checked code would do with a run."""

    FAILS = "fails"  # the run would fail on it
    DRIFTS = "drifts"  # the run would continue, not as it started


@dataclass(frozen=True)
class Finding:
    """One reason one run would not be served as it started."""

    run_id: str
    agent: str
    status: str
    verdict: Verdict
    why: str

    def to_json(self) -> dict[str, str]:
        return {
            "run_id": self.run_id,
            "agent": self.agent,
            "status": self.status,
            "verdict": self.verdict.value,
            "why": self.why,
        }


@dataclass
class DeployCheck:
    """Every live run checked, and what would not be served as it started."""

    checked: int = 0
    findings: list[Finding] = field(default_factory=list)

    def count(self, verdict: Verdict) -> int:
        """How many runs have at least one finding of this verdict."""
        return len({f.run_id for f in self.findings if f.verdict is verdict})

    def to_json(self) -> dict[str, Any]:
        return {
            "checked": self.checked,
            "fail": self.count(Verdict.FAILS),
            "drift": self.count(Verdict.DRIFTS),
            "findings": [f.to_json() for f in self.findings],
        }


@dataclass(frozen=True)
class Code:
    """What the checked code serves: its seal keys, its tools (with its framework agents and
    job kinds) and its deployment's model endpoints."""

    sealer: Sealer
    tools: ToolRegistry
    profiles: dict[str, ModelProfile]


def check_deploy(engine: sa.Engine, code: Code, page: int = PAGE) -> DeployCheck:
    """Judge every run in flight, waiting or queued against `code`."""
    report = DeployCheck()
    for row in live_runs(engine, page):
        report.checked += 1
        report.findings += [
            Finding(row.id, row.agent, row.status.value, verdict, why)
            for verdict, why in problems(row, code)
        ]
    return report


def live_runs(engine: sa.Engine, page: int = PAGE) -> Iterator[RunRow]:
    """Every run in flight, waiting or queued, a page at a time along the primary key."""
    after = FIRST_ID
    while True:
        with engine.connect() as conn:
            rows = live_runs_after(conn, after, page)
        yield from rows
        if len(rows) < page:
            return
        after = rows[-1].id


def problems(row: RunRow, code: Code) -> list[tuple[Verdict, str]]:
    """Why `code` would not serve this run as it started (none when it would)."""
    try:
        definition = RunDefinition.open(code.sealer, row)
    except NewerFormat as exc:
        return [(Verdict.FAILS, f"{exc}; {NOT_READ}")]
    except SealError as exc:
        return [(Verdict.FAILS, f"its definition does not open with this code: {exc}")]
    found = _model_problems(definition, code)
    job = definition.job
    if job is not None and str(job.get("kind")) not in code.tools.jobs:
        found.append((Verdict.FAILS, f"job kind {job.get('kind')!r} is not declared"))
    if row.pin is None:  # stored before pins: served as the code now says
        found += [
            (
                Verdict.DRIFTS,
                f"tool {name} is gone: the model is no longer offered it, calls refused",
            )
            for name in code.tools.unknown(definition.tools)
        ]
        return found
    return found + _pin_problems(row, row.pin, definition, code)


def _pin_problems(
    row: RunRow, sealed: bytes, definition: RunDefinition, code: Code
) -> list[tuple[Verdict, str]]:
    """The run's pin against `code`, as a worker of it judges it (runtime/core/drift.py)."""
    try:
        pin = Pin.open(code.sealer, row.id, sealed)
    except NewerFormat as exc:
        return [(Verdict.FAILS, f"{exc}; {NOT_READ}")]
    except SealError as exc:
        return [(Verdict.FAILS, f"its pin does not open with this code: {exc}")]
    model = pinned_model(definition.model, code.profiles, code.tools, definition.agent)
    unserved = pin.unserved(code.tools, definition.agent, model)
    changes = "; ".join(change.say() for change in unserved)
    if not changes:
        return []
    if pin.policy is Policy.FOLLOW_LATEST:
        return [(Verdict.DRIFTS, f"{changes}: it follows the latest, re-pinned to this code")]
    return [
        (
            Verdict.FAILS,
            f"{changes}: it is pinned, so it waits for a worker whose code serves it, and fails "
            "after LIYAGENT_DEFINITION_WAIT_S once none remains",
        )
    ]


def _model_problems(definition: RunDefinition, code: Code) -> list[tuple[Verdict, str]]:
    """The run's model spec, checked as a worker of `code` checks it before each call."""
    if not definition.model:
        return []
    try:
        spec = specs.check(definition.model, code.profiles)
    except ModelError as exc:
        return [(Verdict.FAILS, f"its model: {exc}")]
    if isinstance(spec, specs.FrameworkSpec):
        guest = code.tools.guests.get(spec.agent)
        if guest is None or guest.framework != spec.framework:
            why = f"the {spec.framework} agent {spec.agent!r} is not registered"
            return [(Verdict.FAILS, why)]
    return []


__all__ = [
    "PAGE",
    "Code",
    "DeployCheck",
    "Finding",
    "Verdict",
    "check_deploy",
    "live_runs",
    "problems",
]
