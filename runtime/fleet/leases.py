"""Run leases in Redis: `checkpoint:<run id>` holds a token naming the attempt.

Acquire, renew and release are compare-and-set Lua scripts (runtime/fleet/lua/, one file each,
its keys in its header). Each also keeps a sorted set of lease deadlines (`leases:deadlines`,
member = token) so the sweeper finds lapsed leases by an index instead of reading every running
run, and per holder the set of its tokens (`holder:<holder>:leases`) and of the messages it
reserved (`holder:<holder>:reserved`), with every holder that has either in `holders`, so the
death watch takes a dead holder's work back without reading every running run. Redis says who
is alive; a lapsed or taken key never by itself lets anyone write: Postgres's attempt fence
does that (I3).

The operations live by concern: a lease's life (lease_life.py), holders and their work and
taking a dead holder's back (holder_work.py), the deadline index and its fences
(deadline_index.py), which Redis this is (store_epoch.py); `Leases` is all of them over one
client and namespace.
"""

from __future__ import annotations

from runtime.fleet.deadline_index import DeadlineIndex
from runtime.fleet.holder_work import HolderWork
from runtime.fleet.lease_life import LeaseLife
from runtime.fleet.store_epoch import StoreEpoch as StoreEpoch
from runtime.fleet.store_epoch import StoreEpochs
from runtime.fleet.store_epoch import read_store_epoch as read_store_epoch
from runtime.fleet.tokens import CONNECTION_PREFIX as CONNECTION_PREFIX
from runtime.fleet.tokens import FENCE_HOLDER as FENCE_HOLDER
from runtime.fleet.tokens import NO_STEP as NO_STEP
from runtime.fleet.tokens import WITNESS_TTL_S as WITNESS_TTL_S
from runtime.fleet.tokens import Acquired as Acquired
from runtime.fleet.tokens import Token as Token
from runtime.fleet.tokens import fence_token as fence_token
from runtime.fleet.tokens import monotonic_ms as monotonic_ms
from runtime.fleet.tokens import store_epoch_key as store_epoch_key


class Leases(LeaseLife, HolderWork, DeadlineIndex, StoreEpochs):
    """Lease operations under one key namespace."""
