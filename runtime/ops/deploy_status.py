"""`liyagent deploy status`: during a rolling deploy, the live runs by the definition version
they are pinned to (runtime/durable/pins.py), each version's policy, agents and runs queued,
running and waiting, and how many of them wait for a worker whose code serves them
(runtime/core/drift.py). Read-only, a page of runs at a time."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import sqlalchemy as sa

from runtime.base.sealing import Sealer, SealError
from runtime.durable.pins import NewerFormat, Pin
from runtime.ops.deploy_check import live_runs
from store.pins import DEFINITION_WAIT

# What a run with no readable pin is counted under.
UNPINNED = "(none: stored before pins)"
NEWER = "(newer than this code reads)"
UNREADABLE = "(does not open with these keys)"


@dataclass
class Version:
    """The live runs pinned to one definition version."""

    pin: str
    policy: str | None
    agents: set[str] = field(default_factory=set)
    statuses: Counter[str] = field(default_factory=Counter)
    # Of them, those waiting for a worker whose code serves their pin.
    waiting_for_code: int = 0

    def to_json(self) -> dict[str, Any]:
        return {
            "pin": self.pin,
            "policy": self.policy,
            "agents": sorted(self.agents),
            "runs": dict(sorted(self.statuses.items())),
            "waiting_for_code": self.waiting_for_code,
        }


def deploy_status(engine: sa.Engine, sealer: Sealer) -> list[Version]:
    """Every live run counted under the definition version it is pinned to, most runs first."""
    versions: dict[str, Version] = {}
    for row in live_runs(engine):
        pin_id, policy = _version_of(sealer, row.id, row.pin)
        version = versions.setdefault(pin_id, Version(pin_id, policy))
        version.agents.add(row.agent)
        version.statuses[row.status.value] += 1
        if (row.waiting_on or "").startswith(DEFINITION_WAIT):
            version.waiting_for_code += 1
    return sorted(versions.values(), key=lambda v: (-v.statuses.total(), v.pin))


def _version_of(sealer: Sealer, run_id: str, sealed: bytes | None) -> tuple[str, str | None]:
    if sealed is None:
        return UNPINNED, None
    try:
        pin = Pin.open(sealer, run_id, sealed)
    except NewerFormat:
        return NEWER, None
    except SealError:
        return UNREADABLE, None
    return pin.id, pin.policy.value


__all__ = ["Version", "deploy_status"]
