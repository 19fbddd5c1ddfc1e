"""What one attempt and the delivery that starts it, and the door that creates runs, use of a
process's assembly, and nothing more (issue 32's narrower seams: the executor, the attempt
classes, their routers and `enqueue` say what they read, not the whole `Services`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import redis
import sqlalchemy as sa

from runtime.base.changes import RunChanges
from runtime.base.sealing import Sealer
from runtime.base.settings import Settings
from runtime.base.tracing import Tracing
from runtime.core.entry import HandOnDeps
from runtime.fleet.heartbeat import Heartbeat
from runtime.fleet.leases import Leases
from runtime.fleet.presence import Presence
from runtime.flow.gate import EndpointGates
from runtime.models import profiles
from runtime.models.base import ModelProvider
from runtime.models.profiles import ModelProfile
from runtime.recovery import outage
from runtime.services import Publisher, Services
from runtime.toolbox.tools import ToolRegistry

# The provider a model spec names, for a run (`Services.provider_for`: checked against this
# worker's model profiles, fail closed).
ProviderFor = Callable[[dict[str, Any], str], ModelProvider]


@dataclass(frozen=True)
class DoorDeps:
    """What the enqueue door (`enqueue`, `check_definition`) uses: the store, the seal, the
    queue and the nudges, the tools and models a request is checked against, the limits."""

    engine: sa.Engine
    sealer: Sealer
    publisher: Publisher
    changes: RunChanges
    tools: ToolRegistry
    # The step size limit, whether entry runs are written ahead, the model profiles.
    settings: Settings

    @classmethod
    def of(cls, s: Services) -> DoorDeps:
        """The fields of a process's assembly that the door uses."""
        return cls(
            engine=s.engine,
            sealer=s.sealer,
            publisher=s.publisher,
            changes=s.changes,
            tools=s.tools,
            settings=s.settings,
        )

    def model_profiles(self) -> dict[str, ModelProfile]:
        """The model endpoints this deployment declares (as `Services.model_profiles`)."""
        return profiles.parse(self.settings.model_profiles)


@dataclass(frozen=True)
class AttemptDeps:
    """The executor's, an attempt's and its call and wait routers' dependencies."""

    engine: sa.Engine
    leases: Leases
    heartbeat: Heartbeat
    sealer: Sealer
    tools: ToolRegistry
    publisher: Publisher
    changes: RunChanges
    tracing: Tracing
    provider_for: ProviderFor
    # The model profile a run's spec resolves to (None: no endpoint), and the fleet's gates
    # of those endpoints (runtime/flow/).
    endpoint_of: Callable[[dict[str, Any]], str | None]
    flow: EndpointGates
    # The limits, timings and retention an attempt applies, and what a job kind's parameters
    # are checked against (its validators' context: the whole settings, as before).
    settings: Settings
    # This process's holder name (lease tokens, audits), its presence (started before a lease
    # is trusted), its Redis (the fenced count) and where its outage lines are paced.
    holder: str
    presence: Presence
    redis: redis.Redis[bytes]
    notice: outage.Notice
    # The door a delegation starts its sub-agent's run through.
    door: DoorDeps
    # What an entry point's hand-on of the answer uses (`EntryPoint.hand_on`).
    hand_on: HandOnDeps
    # The whole assembly, for the public job API alone (`JobContext.services`: a team's job
    # kind reads its engine, settings, tools or provider from it, runtime/toolbox/job_kinds.py);
    # nothing of the engine reads it.
    services: Services

    def model_profiles(self) -> dict[str, ModelProfile]:
        """The model endpoints this deployment declares (their limits: runtime/flow/)."""
        return profiles.parse(self.settings.model_profiles)

    @classmethod
    def of(cls, s: Services) -> AttemptDeps:
        """The fields of a process's assembly that an attempt and its delivery use."""
        return cls(
            engine=s.engine,
            leases=s.leases,
            heartbeat=s.heartbeat,
            sealer=s.sealer,
            tools=s.tools,
            publisher=s.publisher,
            changes=s.changes,
            tracing=s.tracing,
            provider_for=s.provider_for,
            endpoint_of=s.endpoint_of,
            flow=s.flow,
            settings=s.settings,
            holder=s.holder,
            presence=s.presence,
            redis=s.redis,
            notice=outage.Notice.of(s),
            door=DoorDeps.of(s),
            hand_on=HandOnDeps.of(s),
            services=s,
        )
