"""Which Redis this is (`store:epoch`: its data id, when it was born and when it came back, by
its own clock; lua/epoch.lua), the once-per-epoch marks (lua/epoch_mark.lua), and which holders
reach Postgres (`postgres:reached`, lua/reached.lua, others_reached.lua): what lets a store
fault be told from a death."""

from __future__ import annotations

import uuid
from dataclasses import dataclass

import redis

from runtime.fleet.base import LeaseKeys
from runtime.fleet.scripts import source
from runtime.fleet.tokens import store_epoch_key, text_of


@dataclass(frozen=True)
class StoreEpoch:
    """Which Redis this is (see lua/epoch.lua): its data id and when it came back, by its clock."""

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


def read_store_epoch(client: redis.Redis[bytes], namespace: str) -> StoreEpoch:
    """Run lua/epoch.lua on this client (the presence's own connection, or the shared one)."""
    script = client.register_script(source("epoch"))
    return epoch_of(script(keys=[store_epoch_key(namespace)], args=[uuid.uuid4().hex]))


def epoch_of(raw: list[bytes | int]) -> StoreEpoch:
    return StoreEpoch(
        id=text_of(raw[0]),  # type: ignore[arg-type]
        born_ms=int(raw[1]),
        back_ms=int(raw[2]),
        now_ms=int(raw[3]),
        reconciled=bool(int(raw[4])),
        requeued=bool(int(raw[5])),
    )


class StoreEpochs(LeaseKeys):
    """The store epoch and its marks; who reaches Postgres."""

    def store_epoch(self) -> StoreEpoch:
        """Which Redis this is and when it came back (one round trip, see `_EPOCH`)."""
        return epoch_of(self.scripts["epoch"](keys=[self.epoch_key], args=[uuid.uuid4().hex]))

    def mark_epoch(self, epoch: StoreEpoch, mark: str) -> bool:
        """Set a once-per-epoch mark; True for the one caller that set it (see `_EPOCH_MARK`)."""
        return bool(self.scripts["epoch_mark"](keys=[self.epoch_key], args=[epoch.id, mark]))

    def reached_postgres(self, holder: str, keep_ms: int) -> None:
        """This holder's probe just reached Postgres (see `_REACHED`)."""
        self.scripts["reached"](keys=[self.reached_key], args=[holder, keep_ms])

    def others_reached_ms_ago(self, holder: str) -> int | None:
        """How long ago, by Redis's clock, another holder last reached Postgres (None: none
        known)."""
        ago = int(self.scripts["others_reached"](keys=[self.reached_key], args=[holder]))
        return None if ago < 0 else ago
