"""Run leases in Redis: `checkpoint:<run id>` holds a token naming the attempt.

Acquire, renew and release are compare-and-set Lua scripts. Each also keeps a sorted set of
lease deadlines (`leases:deadlines`, member = token) so the sweeper finds lapsed leases by an
index instead of reading every running run. Redis says who is alive; a lapsed key never by
itself lets anyone write: Postgres's attempt fence does that (I3).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import redis

# KEYS[1] = lease key, KEYS[2] = deadlines zset; ARGV[1] = token, ARGV[2] = ttl ms.
# Sets the lease only if nobody holds it, and indexes its deadline (by Redis's own clock).
_ACQUIRE = """
local ok = redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2])
if not ok then return 0 end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZADD', KEYS[2], now + tonumber(ARGV[2]), ARGV[1])
return 1
"""

# KEYS[1] = lease key, KEYS[2] = deadlines zset; ARGV[1] = token, ARGV[2] = ttl ms.
# Extends the lease only while it still holds this token: never renews a lease a newer
# attempt has taken (which `SET XX` would).
_RENEW = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZADD', KEYS[2], now + tonumber(ARGV[2]), ARGV[1])
return 1
"""

# KEYS[1] = lease key, KEYS[2] = deadlines zset; ARGV[1] = token.
# Deletes the lease only if it still holds this token; always drops the token's index entry.
_RELEASE = """
redis.call('ZREM', KEYS[2], ARGV[1])
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('DEL', KEYS[1])
return 1
"""

# KEYS[1] = deadlines zset; ARGV[1] = max entries. Tokens whose deadline passed, by Redis's clock.
_LAPSED = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
return redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', 0, tonumber(ARGV[1]))
"""


@dataclass(frozen=True)
class Token:
    """Names one attempt of one run: `<run id>:<attempt>:<holder>`."""

    run_id: str
    attempt: int
    holder: str

    def __str__(self) -> str:
        return f"{self.run_id}:{self.attempt}:{self.holder}"

    @classmethod
    def parse(cls, raw: str) -> Token:
        run_id, attempt, holder = raw.split(":", 2)
        return cls(run_id, int(attempt), holder)


class Leases:
    """Lease operations under one key namespace."""

    def __init__(self, client: redis.Redis[bytes], namespace: str, ttl_ms: int) -> None:
        self.client = client
        self.namespace = namespace
        self.ttl_ms = ttl_ms
        self.deadlines = f"{namespace}leases:deadlines"
        self._acquire = client.register_script(_ACQUIRE)
        self._renew = client.register_script(_RENEW)
        self._release = client.register_script(_RELEASE)
        self._lapsed = client.register_script(_LAPSED)

    def key(self, run_id: str) -> str:
        return f"{self.namespace}checkpoint:{run_id}"

    def acquire(self, token: Token) -> bool:
        return bool(
            self._acquire(
                keys=[self.key(token.run_id), self.deadlines], args=[str(token), self.ttl_ms]
            )
        )

    def renew(self, token: Token) -> bool:
        return bool(
            self._renew(
                keys=[self.key(token.run_id), self.deadlines], args=[str(token), self.ttl_ms]
            )
        )

    def renew_many(self, tokens: list[Token]) -> list[bool]:
        """Renew several leases in one round trip (the heartbeat's pipeline)."""
        pipe = self.client.pipeline(transaction=False)
        for token in tokens:
            self._renew(
                keys=[self.key(token.run_id), self.deadlines],
                args=[str(token), self.ttl_ms],
                client=pipe,
            )
        return [bool(r) for r in pipe.execute()]

    def release(self, token: Token) -> bool:
        return bool(self._release(keys=[self.key(token.run_id), self.deadlines], args=[str(token)]))

    def holder(self, run_id: str) -> str | None:
        raw = self.client.get(self.key(run_id))
        return None if raw is None else raw.decode() if isinstance(raw, bytes) else str(raw)

    def holders(self, run_ids: list[str]) -> list[str | None]:
        """Who holds each of these runs' leases now, in one round trip (MGET)."""
        if not run_ids:
            return []
        raw = self.client.mget([self.key(r) for r in run_ids])
        return [None if v is None else v.decode() if isinstance(v, bytes) else str(v) for v in raw]

    def lapsed(self, limit: int = 1000) -> list[Token]:
        raw = self._lapsed(keys=[self.deadlines], args=[limit])
        return [Token.parse(r.decode() if isinstance(r, bytes) else r) for r in raw]

    def forget(self, token: Token) -> None:
        """Drop a stale index entry (its lease is gone or belongs to a newer attempt)."""
        self.forget_many([token])

    def forget_many(self, tokens: list[Token]) -> None:
        if tokens:
            self.client.zrem(self.deadlines, *[str(t) for t in tokens])

    def alive(self, run_ids: list[str], chunk: int = 10_000) -> set[str]:
        """Which of these runs hold a lease now (MGET in chunks: one round trip each)."""
        held: set[str] = set()
        for start in range(0, len(run_ids), chunk):
            part = run_ids[start : start + chunk]
            held.update(r for r, h in zip(part, self.holders(part), strict=True) if h)
        return held


def monotonic_ms() -> int:
    return int(time.monotonic() * 1000)
