"""Who holds work, and taking a dead holder's back: each holder's leases and reserved messages
(`holder:<holder>:leases`, `:reserved`, every holder with either in `holders`, and every
worker's main process consuming the queue in `holders:consumers`, their queues in
`holders:queues`), the holders whose
connections are open, and the death watch's take-back of a dead holder's leases
(lua/take_dead.lua, fenced until the claim commits) or of one pool child's lease
(lua/take_token.lua)."""

from __future__ import annotations

from typing import cast

from runtime.fleet.base import LeaseKeys
from runtime.fleet.tokens import CONNECTION_PREFIX, Token, add_consumer, text_of


class HolderWork(LeaseKeys):
    """Holders, reservations, and taking a dead holder's leases."""

    def reserve(self, holder: str, run_id: str, attempt: int) -> None:
        """A worker process received (reserved) this attempt's message."""
        self.scripts["reserve"](
            keys=[self.reserved_of(holder), self.holders_key], args=[f"{run_id}:{attempt}", holder]
        )

    def watch(self, holder: str, queues: tuple[str, ...]) -> None:
        """A worker's main process consumes these queues: among the holders with work from
        its start (`consumers`; its presence puts it back at each reconnect), so its death is
        taken, and the messages it took off its queues and recorded nowhere are looked for
        (runtime/recovery/untraced.py), even when it holds nothing else."""
        add_consumer(self.client, self.namespace, holder, queues)

    def consumers(self) -> set[str]:
        """The worker main processes consuming the runs' queue (one round trip)."""
        return {text_of(h) for h in self.client.smembers(self.consumers_key)}

    def unwatch(self, holder: str) -> None:
        """A worker's main process ended cleanly: no longer a consumer, nor a holder with work
        unless it still has leases or reserved messages (a death's take drops it itself)."""
        keys = [self.leases_of(holder), self.reserved_of(holder), self.holders_key]
        self.scripts["unwatch"](keys=[*keys, self.consumers_key], args=[holder])

    def unreserve(self, holder: str, run_id: str, attempt: int) -> None:
        self.client.srem(self.reserved_of(holder), f"{run_id}:{attempt}")

    def holders_with_work(self) -> set[str]:
        """Every holder with a lease or a reserved message, and every worker's main process
        consuming the queue (one round trip)."""
        found = self.client.sunion([self.holders_key, self.consumers_key])
        return {text_of(cast(bytes, h)) for h in found}

    def all_reserved(self) -> set[str]:
        """Every message reserved by any holder now (`<run id>:<attempt>`), in two round trips."""
        holders = self.holders_with_work()
        if not holders:
            return set()
        pipe = self.client.pipeline(transaction=False)
        for holder in holders:
            pipe.smembers(self.reserved_of(holder))
        return {text_of(m) for members in pipe.execute() for m in members}

    def connected_holders(self) -> set[str]:
        """Holders with at least one open connection, by their connections' names (one round
        trip: CLIENT LIST, whose cost grows with connections, not with runs)."""
        return {
            name[len(CONNECTION_PREFIX) :]
            for client in self.client.client_list()
            if (name := str(client.get("name") or "")).startswith(CONNECTION_PREFIX)
        }

    def presence_epoch(self, holder: str) -> tuple[str, int]:
        """A holder's presence epoch ("" when none) and its key's PTTL (-2 when none), read
        together (MULTI: one round trip): which presence it is and when it was last refreshed
        (`presence.absent_for_ms`)."""
        key = f"{self.namespace}presence:epoch:{holder}"
        pipe = self.client.pipeline(transaction=True)
        pipe.get(key)
        pipe.pttl(key)
        raw, pttl = pipe.execute()
        return ("" if raw is None else text_of(raw)), int(pttl)

    def take_dead(
        self, holder: str, epoch: str
    ) -> tuple[list[Token], list[tuple[str, int]]] | None:
        """A dead holder's leases and reservations, taken back unless it came back (see
        _TAKE_DEAD); None when it did. The taken leases stay fenced until `unfence`."""
        raw = self.scripts["take_dead"](
            keys=[
                f"{self.namespace}presence:epoch:{holder}",
                self.leases_of(holder),
                self.reserved_of(holder),
                self.holders_key,
                self.consumers_key,
            ],
            args=[epoch, holder, self.key(""), self.ttl_ms],
        )
        if raw is None:
            return None
        tokens = [Token.parse(text_of(t)) for t in raw[0]]
        reserved = []
        for member in raw[1]:
            run_id, _, attempt = text_of(member).rpartition(":")
            reserved.append((run_id, int(attempt)))
        return tokens, reserved

    def take_token(self, token: Token) -> bool:
        """Take one lease back from a pool child seen dead: True if it held this token or has
        lapsed (the run is then ours to claim), False if a newer attempt holds it."""
        return bool(
            self.scripts["take_token"](
                keys=[self.key(token.run_id), self.leases_of(token.holder)], args=[str(token)]
            )
        )
