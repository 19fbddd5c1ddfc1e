"""What taking runs back uses, and nothing more: the claims in Postgres, the leases and the
Redis they live in, the queue, the change nudges and the fleet's timings (issue 32's narrower
seams: the sweeper and the death watch say what they read, not the whole `Services`)."""

from __future__ import annotations

from dataclasses import dataclass, field

import redis
import sqlalchemy as sa

from runtime.base.changes import RunChanges
from runtime.base.settings import Timings
from runtime.base.tenancy import TenantLimits
from runtime.fleet.leases import Leases
from runtime.services import Publisher, Services


@dataclass(frozen=True)
class RecoveryDeps:
    """The sweeper's, the death watch's and a lost run's claim's dependencies."""

    engine: sa.Engine
    redis: redis.Redis[bytes]
    leases: Leases
    publisher: Publisher
    changes: RunChanges
    timings: Timings
    # The Redis key prefix of this deployment, and this process's holder name.
    namespace: str
    holder: str
    # Resumed runs first (LIYAGENT_RESUMED_FIRST): a loss's claim asks a running first attempt
    # to yield its slot to each lost run it queues again (store/losses.py).
    resumed_first: bool = True
    # Runs in flight per tenant (runtime/flow/tenants.py): each sweep admits held runs that
    # have room, a backstop for an end whose worker did not.
    tenants: TenantLimits = field(default_factory=TenantLimits)

    @classmethod
    def of(cls, s: Services) -> RecoveryDeps:
        """The fields of a process's assembly that recovery uses."""
        return cls(
            engine=s.engine,
            redis=s.redis,
            leases=s.leases,
            publisher=s.publisher,
            changes=s.changes,
            timings=s.settings.timings,
            namespace=s.settings.namespace,
            holder=s.holder,
            resumed_first=s.settings.resumed_first,
            tenants=s.settings.tenants,
        )
