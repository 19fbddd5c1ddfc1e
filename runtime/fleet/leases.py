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

import contextlib
import time
import uuid
from dataclasses import dataclass

import redis

# The step witness (`steps:<run id>`): the highest step any attempt of the run has written,
# kept beside the lease (`WITNESS_TTL_S`, renewed while the run runs, deleted when it ends) so a
# step removed from Postgres afterwards is seen (runtime/core/attempt.py `_load_state`). Only
# the lease's holder moves it, only upwards; a lost Redis loses it, never a run.
_WITNESS = """
local function witness(key, step, ttl)
  if step == '' then return end
  local now = tonumber(redis.call('GET', key) or '-1')
  if tonumber(step) > now then
    redis.call('SET', key, step, 'EX', ttl)
  else
    redis.call('EXPIRE', key, ttl)
  end
end
"""

# KEYS[1] = lease key, KEYS[2] = deadlines zset, KEYS[3] = the holder's leases set,
# KEYS[4] = holders set, KEYS[5] = the reserving process's reserved set, KEYS[6] = the run's
# step witness; ARGV[1] = token, ARGV[2] = ttl ms, ARGV[3] = holder, ARGV[4] = reserved member
# ("" if none).
# Drops the message's reservation (the delivery has started: it becomes the lease, or it is
# acked or requeued as its result says), then sets the lease only if nobody holds it and
# indexes its deadline (by Redis's own clock) and its holder. Returns 0, or {1, the witness
# ("" when there is none)}.
_ACQUIRE = """
if ARGV[4] ~= '' then redis.call('SREM', KEYS[5], ARGV[4]) end
local ok = redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2])
if not ok then return 0 end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZADD', KEYS[2], now + tonumber(ARGV[2]), ARGV[1])
redis.call('SADD', KEYS[3], ARGV[1])
redis.call('SADD', KEYS[4], ARGV[3])
return {1, redis.call('GET', KEYS[6]) or ''}
"""

# KEYS[1] = lease key, KEYS[2] = deadlines zset, KEYS[3] = the run's step witness;
# ARGV[1] = token, ARGV[2] = ttl ms, ARGV[3] = the step this attempt last wrote ("" if none),
# ARGV[4] = the witness's ttl s.
# Extends the lease only while it still holds this token: never renews a lease a newer
# attempt has taken (which `SET XX` would); the witness moves up to the step written.
_RENEW = (
    _WITNESS
    + """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZADD', KEYS[2], now + tonumber(ARGV[2]), ARGV[1])
witness(KEYS[3], ARGV[3], ARGV[4])
return 1
"""
)

# KEYS[1] = lease key, KEYS[2] = deadlines zset, KEYS[3] = the holder's leases set,
# KEYS[4] = holders set, KEYS[5] = the holder's reserved set, KEYS[6] = the run's step
# witness; ARGV[1] = token, ARGV[2] = holder, ARGV[3] = the step this attempt last wrote (""
# if none), ARGV[4] = the witness's ttl s, ARGV[5] = "1" when the run has ended.
# Deletes the lease only if it still holds this token (recording the step written, or, the run
# ended, dropping the witness); always drops the token's index entries, and the holder from
# `holders` once it has nothing left.
_RELEASE = (
    _WITNESS
    + """
redis.call('ZREM', KEYS[2], ARGV[1])
redis.call('SREM', KEYS[3], ARGV[1])
if redis.call('SCARD', KEYS[3]) == 0 and redis.call('SCARD', KEYS[5]) == 0 then
  redis.call('SREM', KEYS[4], ARGV[2])
end
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('DEL', KEYS[1])
if ARGV[5] == '1' then redis.call('DEL', KEYS[6]) else witness(KEYS[6], ARGV[3], ARGV[4]) end
return 1
"""
)

# KEYS[1] = the holder's reserved set, KEYS[2] = holders set; ARGV[1] = member, ARGV[2] = holder.
# A worker's main process reserved a run's message: visible to the death watch if it dies.
_RESERVE = """
redis.call('SADD', KEYS[1], ARGV[1])
redis.call('SADD', KEYS[2], ARGV[2])
return 1
"""

# KEYS[1] = the holder's presence epoch, KEYS[2] = its leases set, KEYS[3] = its reserved set,
# KEYS[4] = holders set; ARGV[1] = the epoch seen while it was absent, ARGV[2] = holder,
# ARGV[3] = the lease key prefix, ARGV[4] = the fence's ttl ms. A dead holder's work, taken
# back only if it has not reconnected since (a reconnect bumps the epoch first): each lease
# still holding its token, or lapsed already, is fenced (the key set to the fence token, as
# `_FENCE_MISSING` does) until the claim is committed (`Leases.unfence`), so a holder that
# comes back after all fails its renewals and cannot take the lease back (`_RENEW_OR_TAKE_BACK`
# is SET NX) while its run is claimed. Returns those tokens (a later attempt's lease is left
# alone), with the messages it had reserved; false when it came back. Deadline entries stay
# for the sweeper.
_TAKE_DEAD = """
local epoch = redis.call('GET', KEYS[1]) or ''
if epoch ~= ARGV[1] then return false end
local taken = {}
for _, token in ipairs(redis.call('SMEMBERS', KEYS[2])) do
  local run, attempt = string.match(token, '^([^:]+):([^:]+):')
  local held = run and redis.call('GET', ARGV[3] .. run)
  if run and (held == token or held == false) then
    redis.call('SET', ARGV[3] .. run, run .. ':' .. attempt .. ':~sweep', 'PX', ARGV[4])
    table.insert(taken, token)
  end
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


# KEYS[1] = lease key, KEYS[2] = deadlines zset, KEYS[3] = the holder's leases set,
# KEYS[4] = holders set; ARGV[1] = token, ARGV[2] = ttl ms, ARGV[3] = holder.
# A lease last confirmed before Redis lost its data (a new store epoch): renewed while the key
# still holds this token (1); taken back with `SET NX` of this same token, and indexed as an
# acquire does, when the key is absent (2: Redis lost it, and nobody claimed the run since,
# or a claimer's fence would hold the key); left alone when another token holds it (0). A
# taken-back lease is trusted only once Postgres says its attempt still owns the run (I3).
_RENEW_OR_TAKE_BACK = """
local held = redis.call('GET', KEYS[1])
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
if held == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  redis.call('ZADD', KEYS[2], now + tonumber(ARGV[2]), ARGV[1])
  return 1
end
if held ~= false then return 0 end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
redis.call('ZADD', KEYS[2], now + tonumber(ARGV[2]), ARGV[1])
redis.call('SADD', KEYS[3], ARGV[1])
redis.call('SADD', KEYS[4], ARGV[3])
return 2
"""

# KEYS = the lease keys of runs found running with no lease; ARGV[1] = ttl ms, ARGV[2..] = the
# fence token for each key (`<run id>:<attempt>:~sweep`). Before the sweeper claims such a run
# it holds the key itself, only where it is still absent: a holder taking its lease back after
# Redis lost its data (`_RENEW_OR_TAKE_BACK`, SET NX) and the claim exclude each other, so a
# claimed attempt never holds a lease again. Returns 1 per key fenced, 0 per key someone holds.
_FENCE_MISSING = """
local got = {}
for i, key in ipairs(KEYS) do
  if redis.call('SET', key, ARGV[i + 1], 'NX', 'PX', ARGV[1]) then
    got[i] = 1
  else
    got[i] = 0
  end
end
return got
"""

# KEYS = lease keys; ARGV = the fence token for each. Drops each fence `_FENCE_MISSING` set,
# once its claim is done, so the run's next attempt takes its lease at once (a fence left by a
# sweeper that died lapses by its TTL).
_UNFENCE = """
for i, key in ipairs(KEYS) do
  if redis.call('GET', key) == ARGV[i] then redis.call('DEL', key) end
end
return 1
"""

# KEYS[1] = the store epoch hash; ARGV[1] = a fresh epoch id. What Redis this is: the hash's
# `id` names the data (created here when absent, so a Redis that lost its data, restarted
# empty or failed over to an empty replica, shows a new id), `born_ms` when that id was
# created, `run_id` the server's own run id (INFO server: a restart or a failover changes it)
# and `back_ms` when a new data id or run id was first seen, by Redis's clock. Returns
# {id, born_ms, back_ms, now_ms, reconciled, requeued} (the last two: marks set once per
# epoch by `_EPOCH_MARK`). Every process calls it on its own (re)connects and looks; the
# first caller after the store came back stamps `back_ms`.
_EPOCH = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local run = string.match(redis.call('INFO', 'server'), 'run_id:(%w+)') or ''
local id = redis.call('HGET', KEYS[1], 'id')
if not id then
  id = ARGV[1]
  redis.call('HSET', KEYS[1], 'id', id, 'born_ms', now, 'run_id', run, 'back_ms', now)
elseif redis.call('HGET', KEYS[1], 'run_id') ~= run then
  redis.call('HSET', KEYS[1], 'run_id', run, 'back_ms', now)
end
local f = redis.call('HMGET', KEYS[1], 'born_ms', 'back_ms', 'reconciled', 'requeued')
return {id, tonumber(f[1]), tonumber(f[2]), now, f[3] and 1 or 0, f[4] and 1 or 0}
"""

# KEYS[1] = the store epoch hash; ARGV[1] = the epoch id the caller saw, ARGV[2] = a mark
# (`reconciled`: a full reconcile ran after the grace; `requeued`: queued runs were published
# again). 1 for the one caller that set it in this epoch, 0 if set already or the epoch moved.
_EPOCH_MARK = """
if redis.call('HGET', KEYS[1], 'id') ~= ARGV[1] then return 0 end
return redis.call('HSETNX', KEYS[1], ARGV[2], '1')
"""

# KEYS[1] = lease key, KEYS[2] = deadlines zset, KEYS[3] = the holder's leases set,
# KEYS[4] = the let-go set, KEYS[5] = the sweepers' pace key, KEYS[6] = their lock; ARGV[1] =
# token, ARGV[2] = the fence token, ARGV[3] = ttl ms.
# A holder that cannot reach Postgres while others can gives its lease up for a survivor to
# claim as a store fault: while the key still holds its token, the key is fenced at once (as
# `_TAKE_DEAD` does, so no other delivery takes it meanwhile), the token's index entries are
# dropped and it joins the let-go set the sweeper claims from (`Sweeper._claim_given_up`), and
# the pace key and the sweep lock go so the next sweeper to look sweeps at once (a sweep of
# this cut process may hold the lock, hung on Postgres; two sweeps at once are safe, each
# claim is one conditional statement, I4). 0 when the key holds another token already (the
# run was claimed: nothing to give).
_LET_GO = """
redis.call('ZREM', KEYS[2], ARGV[1])
redis.call('SREM', KEYS[3], ARGV[1])
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
redis.call('SADD', KEYS[4], ARGV[1])
redis.call('DEL', KEYS[5], KEYS[6])
return 1
"""

# KEYS[1] = the Postgres-reached zset (member = holder, score = Redis ms); ARGV[1] = holder,
# ARGV[2] = how long an entry is kept (ms). This holder's probe just reached Postgres: its
# entry is stamped by Redis's clock; entries of holders gone longer than that are dropped.
_REACHED = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZADD', KEYS[1], now, ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - tonumber(ARGV[2]))
return 1
"""

# KEYS[1] = the Postgres-reached zset; ARGV[1] = holder. How long ago (ms, by Redis's clock)
# any other holder last reached Postgres; -1 if none is known.
_OTHERS_REACHED = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local top = redis.call('ZREVRANGE', KEYS[1], 0, 1, 'WITHSCORES')
for i = 1, #top, 2 do
  if top[i] ~= ARGV[1] then return now - tonumber(top[i + 1]) end
end
return -1
"""

# The fence token's holder part: no process is named so (holders are host-pid).
FENCE_HOLDER = "~sweep"
# A step witness lives this long past its last renewal (a run waiting longer loses it: a
# rollback of its newest step is then not seen); it is deleted when the run ends.
WITNESS_TTL_S = 30 * 86400
# No step written (none witnessed).
NO_STEP = -1


@dataclass(frozen=True)
class Acquired:
    """A lease taken, with the highest step the run's attempts wrote, as Redis witnessed it
    (`NO_STEP` when Redis holds none: never written, or lost with Redis's data)."""

    witnessed_step: int


@dataclass(frozen=True)
class StoreEpoch:
    """Which Redis this is (see `_EPOCH`): its data id and when it came back, by its clock."""

    id: str
    born_ms: int
    back_ms: int
    now_ms: int
    reconciled: bool
    requeued: bool

    def data_settling(self, grace_ms: int) -> bool:
        """Within the grace after Redis came back without its data (or first started): live
        holders are still taking back the leases it forgot, so no run found without one is
        claimed yet."""
        return self.now_ms - self.born_ms < grace_ms

    def restart_settling(self, grace_ms: int) -> bool:
        """Within the grace after Redis restarted or failed over with its data (a new server
        run id): every holder's connections dropped at once and are coming back, so none is
        judged dead by them yet. (After a data loss no stale holder is left to judge.)"""
        return self.back_ms > self.born_ms and self.now_ms - self.back_ms < grace_ms


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
        self._renew_or_take_back = client.register_script(_RENEW_OR_TAKE_BACK)
        self._fence_missing = client.register_script(_FENCE_MISSING)
        self._unfence = client.register_script(_UNFENCE)
        self._epoch_mark = client.register_script(_EPOCH_MARK)
        self._epoch = client.register_script(_EPOCH)
        self._let_go = client.register_script(_LET_GO)
        self._reached = client.register_script(_REACHED)
        self._others_reached = client.register_script(_OTHERS_REACHED)
        self.epoch_key = store_epoch_key(namespace)
        self.let_go_key = f"{namespace}leases:let_go"
        self.reached_key = f"{namespace}postgres:reached"
        # The fleet's sweep pace (runtime/recovery/sweeper.py): who holds it swept just now.
        self.sweep_pace_key = f"{namespace}sweeper:pace"
        self.sweep_lock_key = f"{namespace}sweeper:lock"

    def key(self, run_id: str) -> str:
        return f"{self.namespace}checkpoint:{run_id}"

    def leases_of(self, holder: str) -> str:
        return f"{self.namespace}holder:{holder}:leases"

    def reserved_of(self, holder: str) -> str:
        return f"{self.namespace}holder:{holder}:reserved"

    def witness_key(self, run_id: str) -> str:
        return f"{self.namespace}steps:{run_id}"

    def forget_steps(self, run_ids: list[str]) -> None:
        """Drop the step witnesses of runs that ended outside an attempt (a sweep's loss limit,
        a Stop, an erasure): one round trip; a failure leaves them to their TTL."""
        if run_ids:
            with contextlib.suppress(redis.RedisError):
                self.client.delete(*[self.witness_key(r) for r in run_ids])

    def acquire(self, token: Token, reserved_by: str | None = None) -> Acquired | None:
        """Take the run's lease for this attempt if free (None otherwise), with the run's step
        witness. Either way the message's reservation by `reserved_by` (the worker process
        that received it) is let go: the delivery started."""
        reserver = reserved_by or token.holder
        got = self._acquire(
            keys=[
                self.key(token.run_id),
                self.deadlines,
                self.leases_of(token.holder),
                self.holders_key,
                self.reserved_of(reserver),
                self.witness_key(token.run_id),
            ],
            args=[
                str(token),
                self.ttl_ms,
                token.holder,
                f"{token.run_id}:{token.attempt}" if reserved_by else "",
            ],
        )
        if not isinstance(got, list):  # 0, or queued on a pipeline (its result comes with it)
            return None
        witnessed = _text(got[1])
        return Acquired(int(witnessed) if witnessed else NO_STEP)

    def renew(self, token: Token, written: int = NO_STEP) -> bool:
        """Renew one lease, moving its run's step witness up to `written` (the step this
        attempt last wrote; `NO_STEP` when none)."""
        return bool(
            self._renew(keys=self._renew_keys(token), args=self._renew_args(token, written))
        )

    def renew_many(self, leases: list[tuple[Token, int]]) -> list[bool]:
        """Renew several leases in one round trip (the heartbeat's pipeline), each with the
        step its attempt last wrote."""
        pipe = self.client.pipeline(transaction=False)
        for token, written in leases:
            self._renew(
                keys=self._renew_keys(token),
                args=self._renew_args(token, written),
                client=pipe,
            )
        return [bool(r) for r in pipe.execute()]

    def _renew_keys(self, token: Token) -> list[str]:
        return [self.key(token.run_id), self.deadlines, self.witness_key(token.run_id)]

    def _renew_args(self, token: Token, written: int) -> list[str | int]:
        step = "" if written == NO_STEP else str(written)
        return [str(token), self.ttl_ms, step, WITNESS_TTL_S]

    def release(self, token: Token, written: int = NO_STEP, ended: bool = False) -> bool:
        """Let the lease go if it still holds this token, recording the step this attempt last
        wrote (a waiting or handed-back run keeps its witness exact), or dropping the witness
        when the run has `ended`."""
        step = "" if written == NO_STEP else str(written)
        return bool(
            self._release(
                keys=[
                    self.key(token.run_id),
                    self.deadlines,
                    self.leases_of(token.holder),
                    self.holders_key,
                    self.reserved_of(token.holder),
                    self.witness_key(token.run_id),
                ],
                args=[str(token), token.holder, step, WITNESS_TTL_S, "1" if ended else ""],
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
        _TAKE_DEAD); None when it did. The taken leases stay fenced until `unfence`."""
        raw = self._take_dead(
            keys=[
                f"{self.namespace}presence:epoch:{holder}",
                self.leases_of(holder),
                self.reserved_of(holder),
                self.holders_key,
            ],
            args=[epoch, holder, self.key(""), self.ttl_ms],
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

    def renew_or_take_back(self, tokens: list[Token]) -> list[int]:
        """Renew leases last confirmed before Redis lost its data, taking back with SET NX of
        their own token those whose key is gone (one round trip; see `_RENEW_OR_TAKE_BACK`):
        1 renewed, 2 taken back (to be confirmed in Postgres), 0 held by another token."""
        pipe = self.client.pipeline(transaction=False)
        for token in tokens:
            self._renew_or_take_back(
                keys=[
                    self.key(token.run_id),
                    self.deadlines,
                    self.leases_of(token.holder),
                    self.holders_key,
                ],
                args=[str(token), self.ttl_ms, token.holder],
                client=pipe,
            )
        return [int(r) for r in pipe.execute()]

    def fence_missing(self, tokens: list[Token]) -> list[Token]:
        """Hold the lease key of each run found running with no lease, where it is still
        absent (see `_FENCE_MISSING`); returns the tokens fenced (the fence tokens' runs)."""
        if not tokens:
            return []
        fences = [fence_token(t) for t in tokens]
        got = self._fence_missing(
            keys=[self.key(t.run_id) for t in tokens],
            args=[self.ttl_ms, *[str(f) for f in fences]],
        )
        return [t for t, ok in zip(tokens, got, strict=True) if int(ok)]

    def unfence(self, tokens: list[Token]) -> None:
        """Drop the fences `fence_missing` set for these tokens (see `_UNFENCE`)."""
        if tokens:
            self._unfence(
                keys=[self.key(t.run_id) for t in tokens],
                args=[str(fence_token(t)) for t in tokens],
            )

    def let_go(self, tokens: list[Token]) -> list[Token]:
        """Give these leases up for survivors to claim as store faults (see `_LET_GO`), in
        one round trip; returns those that were still ours."""
        pipe = self.client.pipeline(transaction=False)
        for token in tokens:
            self._let_go(
                keys=[
                    self.key(token.run_id),
                    self.deadlines,
                    self.leases_of(token.holder),
                    self.let_go_key,
                    self.sweep_pace_key,
                    self.sweep_lock_key,
                ],
                args=[str(token), str(fence_token(token)), self.ttl_ms],
                client=pipe,
            )
        return [t for t, ok in zip(tokens, pipe.execute(), strict=True) if int(ok)]

    def given_up(self) -> list[Token]:
        """Leases their holders gave up for want of Postgres, waiting for a claim."""
        return [Token.parse(_text(m)) for m in self.client.smembers(self.let_go_key)]

    def claimed_given_up(self, tokens: list[Token]) -> None:
        """Drop these from the let-go set: their claims are settled."""
        if tokens:
            self.client.srem(self.let_go_key, *[str(t) for t in tokens])

    def reached_postgres(self, holder: str, keep_ms: int) -> None:
        """This holder's probe just reached Postgres (see `_REACHED`)."""
        self._reached(keys=[self.reached_key], args=[holder, keep_ms])

    def others_reached_ms_ago(self, holder: str) -> int | None:
        """How long ago, by Redis's clock, another holder last reached Postgres (None: none
        known)."""
        ago = int(self._others_reached(keys=[self.reached_key], args=[holder]))
        return None if ago < 0 else ago

    def store_epoch(self) -> StoreEpoch:
        """Which Redis this is and when it came back (one round trip, see `_EPOCH`)."""
        return _epoch_of(self._epoch(keys=[self.epoch_key], args=[uuid.uuid4().hex]))

    def mark_epoch(self, epoch: StoreEpoch, mark: str) -> bool:
        """Set a once-per-epoch mark; True for the one caller that set it (see `_EPOCH_MARK`)."""
        return bool(self._epoch_mark(keys=[self.epoch_key], args=[epoch.id, mark]))

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

    def indexed(self, tokens: list[Token]) -> set[Token]:
        """Which of these tokens still have a deadline in the index (one round trip)."""
        if not tokens:
            return set()
        pipe = self.client.pipeline(transaction=False)
        for token in tokens:
            pipe.zscore(self.deadlines, str(token))
        scores = pipe.execute()
        return {t for t, score in zip(tokens, scores, strict=True) if score is not None}

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


# Every engine process names its Redis connections `lya:<holder>` (runtime/fleet/presence.py).
CONNECTION_PREFIX = "lya:"


def _text(raw: bytes | str) -> str:
    return raw.decode() if isinstance(raw, bytes) else str(raw)


def monotonic_ms() -> int:
    return int(time.monotonic() * 1000)


def store_epoch_key(namespace: str) -> str:
    return f"{namespace}store:epoch"


def fence_token(token: Token) -> Token:
    """The token a sweeper holds a missing lease key with while it claims the run."""
    return Token(token.run_id, token.attempt, FENCE_HOLDER)


def read_store_epoch(client: redis.Redis[bytes], namespace: str) -> StoreEpoch:
    """Run `_EPOCH` on this client (the presence's own connection, or the shared client)."""
    script = client.register_script(_EPOCH)
    return _epoch_of(script(keys=[store_epoch_key(namespace)], args=[uuid.uuid4().hex]))


def _epoch_of(raw: list[bytes | int]) -> StoreEpoch:
    return StoreEpoch(
        id=_text(raw[0]),  # type: ignore[arg-type]
        born_ms=int(raw[1]),
        back_ms=int(raw[2]),
        now_ms=int(raw[3]),
        reconciled=bool(int(raw[4])),
        requeued=bool(int(raw[5])),
    )
