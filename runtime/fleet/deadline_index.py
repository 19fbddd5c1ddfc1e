"""The deadline index (`leases:deadlines`, member = token, score = deadline by Redis's clock): how
the sweeper finds lapsed leases without reading every running run; the fences a sweeper holds
on a run's lease key while it claims it (lua/fence_missing.lua, unfence.lua); and the leases a
holder cut from Postgres gives up for survivors to claim (lua/let_go.lua, `leases:let_go`)."""

from __future__ import annotations

from runtime.fleet.base import LeaseKeys
from runtime.fleet.tokens import Token, fence_token, text_of


class DeadlineIndex(LeaseKeys):
    """Lapsed leases by their deadlines, fences, and leases given up."""

    def lapsed(self, limit: int = 1000) -> list[Token]:
        raw = self.scripts["lapsed"](keys=[self.deadlines], args=[limit])
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

    def fence_missing(self, tokens: list[Token]) -> list[Token]:
        """Hold the lease key of each run found running with no lease, where it is still
        absent (see `_FENCE_MISSING`); returns the tokens fenced (the fence tokens' runs)."""
        if not tokens:
            return []
        fences = [fence_token(t) for t in tokens]
        got = self.scripts["fence_missing"](
            keys=[self.key(t.run_id) for t in tokens],
            args=[self.ttl_ms, *[str(f) for f in fences]],
        )
        return [t for t, ok in zip(tokens, got, strict=True) if int(ok)]

    def unfence(self, tokens: list[Token]) -> None:
        """Drop the fences `fence_missing` set for these tokens (see `_UNFENCE`)."""
        if tokens:
            self.scripts["unfence"](
                keys=[self.key(t.run_id) for t in tokens],
                args=[str(fence_token(t)) for t in tokens],
            )

    def let_go(self, tokens: list[Token]) -> list[Token]:
        """Give these leases up for survivors to claim as store faults (see `_LET_GO`), in
        one round trip; returns those that were still ours."""
        pipe = self.client.pipeline(transaction=False)
        for token in tokens:
            self.scripts["let_go"](
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
        return [Token.parse(text_of(m)) for m in self.client.smembers(self.let_go_key)]

    def claimed_given_up(self, tokens: list[Token]) -> None:
        """Drop these from the let-go set: their claims are settled."""
        if tokens:
            self.client.srem(self.let_go_key, *[str(t) for t in tokens])
