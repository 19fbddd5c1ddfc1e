"""The one way an attempt writes to Postgres: its lease checked first, then the statement.

Every statement an attempt writes is fenced in SQL by its attempt number (I3); before it, the
lease is checked by the local clock (no network), so an attempt that may have lost its lease
stops writing within one lease of losing it, even while Redis is gone: `LeaseLost`, and
nothing is written. A request that leaves the process is checked by `RunLease.check` and the
send guard (`runtime/sending/http.py`) instead; statements that no lease check precedes (a
failure, a suspend, an audit of a resume) use the engine as they are, fenced by SQL alone.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import sqlalchemy as sa

from runtime.base.changes import RunChanges
from runtime.fleet.heartbeat import RunLease


class Fence:
    """An attempt's fenced writes: the lease check, then a connection for the statement."""

    def __init__(
        self, engine: sa.Engine, lease: RunLease, changes: RunChanges | None = None
    ) -> None:
        self.engine = engine
        self.lease = lease
        self.changes = changes

    @contextmanager
    def write(self) -> Iterator[sa.Connection]:
        """A connection for one fenced write, opened only once the lease is still ours by the
        local clock (`LeaseLost` otherwise, raised before anything is written, I3). Once it
        committed, the run's followers are nudged (runtime/base/changes.py)."""
        self.lease.check()
        with self.engine.connect() as conn:
            yield conn
        if self.changes is not None:
            self.changes.announce(self.lease.token.run_id)
