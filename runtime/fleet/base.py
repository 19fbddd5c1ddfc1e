"""What every part of the leases shares: the Redis client, the key namespace, the lease TTL, the
keys' names (`checkpoint:<run id>` holds a lease's token, `steps:<run id>` its run's step
witness, `holder:<holder>:leases` and `:reserved` a holder's work, `leases:deadlines` the
deadline index) and the Lua scripts (runtime/fleet/lua/), registered once per client."""

from __future__ import annotations

import redis

from runtime.fleet.scripts import NAMES, source
from runtime.fleet.tokens import consumers_key, store_epoch_key


class LeaseKeys:
    """The client, the namespace and its keys' names, the scripts, and who holds a lease."""

    def __init__(self, client: redis.Redis[bytes], namespace: str, ttl_ms: int) -> None:
        self.client = client
        self.namespace = namespace
        self.ttl_ms = ttl_ms
        self.deadlines = f"{namespace}leases:deadlines"
        self.holders_key = f"{namespace}holders"
        self.consumers_key = consumers_key(namespace)
        self.scripts = {name: client.register_script(source(name)) for name in NAMES}
        self.epoch_key = store_epoch_key(namespace)
        self.let_go_key = f"{namespace}leases:let_go"
        self.reached_key = f"{namespace}postgres:reached"
        # The fleet's sweep pace (runtime/recovery/sweeper.py): who holds it swept just now.
        self.sweep_pace_key = f"{namespace}sweeper:pace"
        self.sweep_lock_key = f"{namespace}sweeper:lock"
        # Runs whose leases were dropped because they ended outside their attempt (a Stop,
        # an erasure, a loss limit): the holders' drop watches cut their requests at once.
        self.dropped_channel = f"{namespace}leases:dropped"

    def key(self, run_id: str) -> str:
        return f"{self.namespace}checkpoint:{run_id}"

    def leases_of(self, holder: str) -> str:
        return f"{self.namespace}holder:{holder}:leases"

    def reserved_of(self, holder: str) -> str:
        return f"{self.namespace}holder:{holder}:reserved"

    def witness_key(self, run_id: str) -> str:
        return f"{self.namespace}steps:{run_id}"

    def holder(self, run_id: str) -> str | None:
        raw = self.client.get(self.key(run_id))
        return None if raw is None else raw.decode() if isinstance(raw, bytes) else str(raw)

    def holders(self, run_ids: list[str]) -> list[str | None]:
        """Who holds each of these runs' leases now, in one round trip (MGET)."""
        if not run_ids:
            return []
        raw = self.client.mget([self.key(r) for r in run_ids])
        return [None if v is None else v.decode() if isinstance(v, bytes) else str(v) for v in raw]
