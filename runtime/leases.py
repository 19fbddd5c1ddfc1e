"""Run leases in Redis: `checkpoint:<run id>` holds a token naming the attempt.

Acquire, renew and release are compare-and-set Lua scripts. Each also keeps a sorted set of
lease deadlines (`leases:deadlines`, member = token) so the sweeper finds lapsed leases by an
index instead of reading every running run, and per holder the set of its tokens
(`holder:<holder>:leases`) and of the messages it reserved (`holder:<holder>:reserved`), with
every holder that has either in `holders`, so the death watch takes a dead holder's work back
without reading every running run. Redis says who is alive; a lapsed or taken key never by
itself lets anyone write: Postgres's attempt fence does that (I3).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import redis

# KEYS[1] = lease key, KEYS[2] = deadlines zset, KEYS[3] = the holder's leases set,
# KEYS[4] = holders set, KEYS[5] = the reserving process's reserved set;
# ARGV[1] = token, ARGV[2] = ttl ms, ARGV[3] = holder, ARGV[4] = reserved member ("" if none).
# Drops the message's reservation (the delivery has started: it becomes the lease, or it is
# acked or requeued as its result says), then sets the lease only if nobody holds it and
# indexes its deadline (by Redis's own clock) and its holder.
_ACQUIRE = """
if ARGV[4] ~= '' then redis.call('SREM', KEYS[5], ARGV[4]) end
local ok = redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2])
if not ok then return 0 end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZADD', KEYS[2], now + tonumber(ARGV[2]), ARGV[1])
redis.call('SADD', KEYS[3], ARGV[1])
redis.call('SADD', KEYS[4], ARGV[3])
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

# KEYS[1] = lease key, KEYS[2] = deadlines zset, KEYS[3] = the holder's leases set,
# KEYS[4] = holders set, KEYS[5] = the holder's reserved set; ARGV[1] = token, ARGV[2] = holder.
# Deletes the lease only if it still holds this token; always drops the token's index entries,
# and the holder from `holders` once it has nothing left.
_RELEASE = """
redis.call('ZREM', KEYS[2], ARGV[1])
redis.call('SREM', KEYS[3], ARGV[1])
if redis.call('SCARD', KEYS[3]) == 0 and redis.call('SCARD', KEYS[5]) == 0 then
  redis.call('SREM', KEYS[4], ARGV[2])
end
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('DEL', KEYS[1])
return 1
"""

# KEYS[1] = the holder's reserved set, KEYS[2] = holders set; ARGV[1] = member, ARGV[2] = holder.
# A worker's main process reserved a run's message: visible to the death watch if it dies.
_RESERVE = """
redis.call('SADD', KEYS[1], ARGV[1])
redis.call('SADD', KEYS[2], ARGV[2])
return 1
"""

# KEYS[1] = the holder's presence epoch, KEYS[2] = its leases set, KEYS[3] = its reserved set,
# KEYS[4] = holders set; ARGV[1] = the epoch seen while it was absent, ARGV[2] = holder,
# ARGV[3] = the lease key prefix. A dead holder's work, taken back only if it has not
# reconnected since (a reconnect bumps the epoch first): deletes each lease still holding its
# token (so a holder that comes back fails its renewals) and returns those tokens and the ones
# whose lease has lapsed already (a later attempt's lease is left alone), with the messages it
# had reserved; false when it came back. Deadline entries stay for the sweeper.
_TAKE_DEAD = """
local epoch = redis.call('GET', KEYS[1]) or ''
if epoch ~= ARGV[1] then return false end
local taken = {}
for _, token in ipairs(redis.call('SMEMBERS', KEYS[2])) do
  local run = string.match(token, '^([^:]+):')
  local held = run and redis.call('GET', ARGV[3] .. run)
  if held == token then redis.call('DEL', ARGV[3] .. run) end
  if run and (held == token or held == false) then table.insert(taken, token) end
end
local reserved = redis.call('SMEMBERS', KEYS[3])
redis.call('DEL', KEYS[2], KEYS[3])
redis.call('SREM', KEYS[4], ARGV[2])
return {taken, reserved}
"""

# KEYS[1] = lease key, KEYS[2] = the holder's leases set; ARGV[1] = token.
# One lease taken back from a pool child its parent saw die: deleted while it holds this
# token, and also ours to claim when it has lapsed already (a parent can see the death after
# the lease's TTL on a loaded machine), exactly as `_TAKE_DEAD` does; a lease a newer attempt
# holds is left alone. The claim in Postgres is fenced by the attempt (I4).
_TAKE_TOKEN = """
redis.call('SREM', KEYS[2], ARGV[1])
local held = redis.call('GET', KEYS[1])
if held == false then return 1 end
if held ~= ARGV[1] then return 0 end
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
        self.holders_key = f"{namespace}holders"
        self._acquire = client.register_script(_ACQUIRE)
        self._renew = client.register_script(_RENEW)
        self._release = client.register_script(_RELEASE)
        self._lapsed = client.register_script(_LAPSED)
        self._reserve = client.register_script(_RESERVE)
        self._take_dead = client.register_script(_TAKE_DEAD)
        self._take_token = client.register_script(_TAKE_TOKEN)

    def key(self, run_id: str) -> str:
        return f"{self.namespace}checkpoint:{run_id}"

    def leases_of(self, holder: str) -> str:
        return f"{self.namespace}holder:{holder}:leases"

    def reserved_of(self, holder: str) -> str:
        return f"{self.namespace}holder:{holder}:reserved"

    def acquire(self, token: Token, reserved_by: str | None = None) -> bool:
        """Take the run's lease for this attempt if free. Either way the message's reservation
        by `reserved_by` (the worker process that received it) is let go: the delivery started."""
        reserver = reserved_by or token.holder
        return bool(
            self._acquire(
                keys=[
                    self.key(token.run_id),
                    self.deadlines,
                    self.leases_of(token.holder),
                    self.holders_key,
                    self.reserved_of(reserver),
                ],
                args=[
                    str(token),
                    self.ttl_ms,
                    token.holder,
                    f"{token.run_id}:{token.attempt}" if reserved_by else "",
                ],
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
        return bool(
            self._release(
                keys=[
                    self.key(token.run_id),
                    self.deadlines,
                    self.leases_of(token.holder),
                    self.holders_key,
                    self.reserved_of(token.holder),
                ],
                args=[str(token), token.holder],
            )
        )

    def reserve(self, holder: str, run_id: str, attempt: int) -> None:
        """A worker process received (reserved) this attempt's message."""
        self._reserve(
            keys=[self.reserved_of(holder), self.holders_key], args=[f"{run_id}:{attempt}", holder]
        )

    def unreserve(self, holder: str, run_id: str, attempt: int) -> None:
        self.client.srem(self.reserved_of(holder), f"{run_id}:{attempt}")

    def holders_with_work(self) -> set[str]:
        """Every holder with a lease or a reserved message (one round trip)."""
        return {_text(h) for h in self.client.smembers(self.holders_key)}

    def all_reserved(self) -> set[str]:
        """Every message reserved by any holder now (`<run id>:<attempt>`), in two round trips."""
        holders = self.holders_with_work()
        if not holders:
            return set()
        pipe = self.client.pipeline(transaction=False)
        for holder in holders:
            pipe.smembers(self.reserved_of(holder))
        return {_text(m) for members in pipe.execute() for m in members}

    def connected_holders(self) -> set[str]:
        """Holders with at least one open connection, by their connections' names (one round
        trip: CLIENT LIST, whose cost grows with connections, not with runs)."""
        return {
            name[len(CONNECTION_PREFIX) :]
            for client in self.client.client_list()
            if (name := str(client.get("name") or "")).startswith(CONNECTION_PREFIX)
        }

    def presence_epoch(self, holder: str) -> str:
        raw = self.client.get(f"{self.namespace}presence:epoch:{holder}")
        return "" if raw is None else _text(raw)

    def take_dead(
        self, holder: str, epoch: str
    ) -> tuple[list[Token], list[tuple[str, int]]] | None:
        """A dead holder's leases and reservations, taken back unless it came back (see
        _TAKE_DEAD); None when it did."""
        raw = self._take_dead(
            keys=[
                f"{self.namespace}presence:epoch:{holder}",
                self.leases_of(holder),
                self.reserved_of(holder),
                self.holders_key,
            ],
            args=[epoch, holder, self.key("")],
        )
        if raw is None:
            return None
        tokens = [Token.parse(_text(t)) for t in raw[0]]
        reserved = []
        for member in raw[1]:
            run_id, _, attempt = _text(member).rpartition(":")
            reserved.append((run_id, int(attempt)))
        return tokens, reserved

    def take_token(self, token: Token) -> bool:
        """Take one lease back from a pool child seen dead: True if it held this token or has
        lapsed (the run is then ours to claim), False if a newer attempt holds it."""
        return bool(
            self._take_token(
                keys=[self.key(token.run_id), self.leases_of(token.holder)], args=[str(token)]
            )
        )

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
        """Drop stale index entries: their deadlines and their holders' token sets."""
        if not tokens:
            return
        pipe = self.client.pipeline(transaction=False)
        pipe.zrem(self.deadlines, *[str(t) for t in tokens])
        for token in tokens:
            if token.holder != "?":
                pipe.srem(self.leases_of(token.holder), str(token))
        pipe.execute()

    def alive(self, run_ids: list[str], chunk: int = 10_000) -> set[str]:
        """Which of these runs hold a lease now (MGET in chunks: one round trip each)."""
        held: set[str] = set()
        for start in range(0, len(run_ids), chunk):
            part = run_ids[start : start + chunk]
            held.update(r for r, h in zip(part, self.holders(part), strict=True) if h)
        return held


# Every engine process names its Redis connections `lya:<holder>` (runtime/presence.py).
CONNECTION_PREFIX = "lya:"


def _text(raw: bytes | str) -> str:
    return raw.decode() if isinstance(raw, bytes) else str(raw)


def monotonic_ms() -> int:
    return int(time.monotonic() * 1000)
