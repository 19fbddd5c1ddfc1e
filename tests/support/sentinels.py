"""A private Redis primary, its replica and three Sentinels on loopback, for tests that fail
Redis over the way a Sentinel deployment does."""

from __future__ import annotations

import time
from pathlib import Path

import redis

from liyagent.local.servers import PrivateRedis, PrivateSentinel

MASTER = "liyagent"


class SentinelGroup:
    """Primary, replica (`replicaof`) and three Sentinels (quorum 2, 1 s down-after)."""

    def __init__(self, base: Path, down_after_ms: int = 1000, failover_timeout_ms: int = 3000):
        self.primary = PrivateRedis(base / "primary")
        self.replica = PrivateRedis(base / "replica", replica_of=self.primary.port)
        self.sentinels = [
            PrivateSentinel(
                base / f"sentinel{i}",
                self.primary.port,
                MASTER,
                quorum=2,
                down_after_ms=down_after_ms,
                failover_timeout_ms=failover_timeout_ms,
            )
            for i in range(3)
        ]

    @property
    def url(self) -> str:
        """The one setting the deployment is given: every Sentinel, kombu's form."""
        return ";".join(s.url for s in self.sentinels)

    def start(self, timeout: float = 30.0) -> SentinelGroup:
        """Start them all and wait until the replica is in sync and every Sentinel knows the
        replica and the two other Sentinels (a failover needs both)."""
        self.primary.start()
        self.replica.start()
        for s in self.sentinels:
            s.start()
        deadline = time.monotonic() + timeout
        while not self._ready():
            assert time.monotonic() < deadline, "the Sentinels never saw each other and the replica"
            time.sleep(0.1)
        return self

    def _ready(self) -> bool:
        replica = redis.Redis(port=self.replica.port, socket_timeout=1)
        try:
            if replica.info("replication").get("master_link_status") != "up":
                return False
        finally:
            replica.close()
        for s in self.sentinels:
            node = redis.Redis(port=s.port, socket_timeout=1)
            try:
                state = node.sentinel_master(MASTER)
            finally:
                node.close()
            if state["num-other-sentinels"] < 2 or state["num-slaves"] < 1:
                return False
        return True

    def master_port(self) -> int:
        """The master's port as the first Sentinel that answers names it."""
        for s in self.sentinels:
            node = redis.Redis(port=s.port, socket_timeout=1)
            try:
                return int(node.sentinel_get_master_addr_by_name(MASTER)[1])
            except redis.RedisError:
                continue
            finally:
                node.close()
        raise AssertionError("no Sentinel answers")

    def stop(self) -> None:
        for server in [*self.sentinels, self.replica, self.primary]:
            server.stop()
