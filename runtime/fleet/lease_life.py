"""A lease's life: acquired for one attempt (with its run's step witness), renewed (one at a
boundary, or all of a process's in the heartbeat's pipeline), released (recording the step
written, or dropping the witness when the run ended), or renewed and taken back after Redis
lost its data. Each is one compare-and-set script (lua/acquire.lua, renew.lua, release.lua,
renew_or_take_back.lua): never renews or releases a lease a newer attempt holds."""

from __future__ import annotations

import contextlib

import redis

from runtime.fleet.base import LeaseKeys
from runtime.fleet.tokens import NO_STEP, WITNESS_TTL_S, Acquired, Token, fence_token, text_of


class LeaseLife(LeaseKeys):
    """Acquire, renew, release."""

    def forget_steps(self, run_ids: list[str]) -> None:
        """Drop the step witnesses and leases of runs that ended outside an attempt (a sweep's
        loss limit, a Stop, an erasure), and say so on `leases:dropped`: an attempt still in
        flight hears it (its holder's drop watch, runtime/fleet/drops.py) and has its requests
        cut at once; one that does not finds its lease gone at its heartbeat's next renewal.
        Its writes were fenced out in Postgres already (I3). One round trip; a failure leaves
        the keys to their TTL and the attempts to their renewal."""
        if run_ids:
            keys = [k for r in run_ids for k in (self.witness_key(r), self.key(r))]
            pipe = self.client.pipeline(transaction=False)
            pipe.delete(*keys)
            pipe.publish(self.dropped_channel, " ".join(run_ids))
            with contextlib.suppress(redis.RedisError):
                pipe.execute()

    def cut_attempts(self, runs: list[tuple[str, int]]) -> None:
        """These runs' attempts before the given one were fenced out in Postgres by a Stop that
        handed each run to a new attempt: a running attempt's lease is replaced by a fence for
        it (`<run>:<old attempt>:~sweep`, the lease TTL; only where a lease is held), so its next
        renewal fails even if it misses the word, and the new attempt's delivery waits (an
        older attempt's fence); then it is said on `leases:dropped` (`<run>:<new attempt>`):
        the holder cuts the attempt's requests at once and, once it has stopped, lifts the
        fence (`unfence`), and the new attempt takes the lease. Two attempts of a run never
        send at once. One round trip; a failure costs only time."""
        if runs:
            pipe = self.client.pipeline(transaction=False)
            for run_id, attempt in runs:
                fence = fence_token(Token(run_id, attempt - 1, ""))
                pipe.set(self.key(run_id), str(fence), px=self.ttl_ms, xx=True)
            pipe.publish(self.dropped_channel, " ".join(f"{r}:{a}" for r, a in runs))
            with contextlib.suppress(redis.RedisError):
                pipe.execute()

    def acquire(self, token: Token, reserved_by: str | None = None) -> Acquired | None:
        """Take the run's lease for this attempt if free (None otherwise), with the run's step
        witness. Either way the message's reservation by `reserved_by` (the worker process
        that received it) is let go: the delivery started."""
        reserver = reserved_by or token.holder
        got = self.scripts["acquire"](
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
        witnessed = text_of(got[1])
        return Acquired(int(witnessed) if witnessed else NO_STEP)

    def renew(self, token: Token, written: int = NO_STEP) -> bool:
        """Renew one lease, moving its run's step witness up to `written` (the step this
        attempt last wrote; `NO_STEP` when none)."""
        return bool(
            self.scripts["renew"](
                keys=self._renew_keys(token), args=self._renew_args(token, written)
            )
        )

    def renew_many(self, leases: list[tuple[Token, int]]) -> list[bool]:
        """Renew several leases in one round trip (the heartbeat's pipeline), each with the
        step its attempt last wrote."""
        pipe = self.client.pipeline(transaction=False)
        for token, written in leases:
            self.scripts["renew"](
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
            self.scripts["release"](
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

    def renew_or_take_back(self, tokens: list[Token]) -> list[int]:
        """Renew leases last confirmed before Redis lost its data, taking back with SET NX of
        their own token those whose key is gone (one round trip; see `_RENEW_OR_TAKE_BACK`):
        1 renewed, 2 taken back (to be confirmed in Postgres), 0 held by another token."""
        pipe = self.client.pipeline(transaction=False)
        for token in tokens:
            self.scripts["renew_or_take_back"](
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
