"""The format of each sealed record a run is resumed from, in one place: what this code writes
and what it reads (issue 35, item 3).

Each names its format (a definition's and a pin's `format`, a checkpoint's and a step record's
`v`). A sealed answer and a call's sealed outcome are read as every version so far wrote them
(their shape has not changed since they were sealed); the release that changes either adds
its format here first. A worker reads every format of before its own; a record of a newer format
than it reads (written by newer code, in a fleet mid-deploy) is never guessed at and never
fails the run: `check` raises `NewerFormat` and the attempt hands the run back to wait for a
worker that reads it (runtime/core/drift.py). A format it cannot place (not a number, or one
it never wrote) is a record it cannot read: ValueError, failed as a seal failure (I6).

A release that changes a record raises its `writes` and adds it to `reads`; it reads the old
one still, so a rolling deploy goes both ways until the last old worker is gone.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass
class Format:
    """One kind of sealed record: the format this code writes, the formats it reads."""

    record: str
    writes: int
    reads: frozenset[int]

    def check(self, run_id: str, found: Any) -> None:
        """Return when this code reads format `found`; NewerFormat when it is newer than all
        it reads; ValueError when it is no format this code knows of."""
        if found in self.reads:
            return
        if isinstance(found, int) and not isinstance(found, bool) and found > max(self.reads):
            raise NewerFormat(run_id, self, found)
        raise ValueError(f"{self.record} format {found!r} is not one this worker reads")


# The run's definition: format 2 adds `output` (a definition without one is still written as
# format 1, so a worker of before it reads every run that does not need it).
DEFINITION = Format("definition", 2, frozenset({1, 2}))
# The run's pin (runtime/durable/pins.py): format 2 adds a framework agent's instructions.
PIN = Format("pin", 2, frozenset({1, 2}))
# A run's base checkpoint (its whole state) and each step's record (what the step added).
CHECKPOINT = Format("checkpoint", 1, frozenset({1}))
STEP_RECORD = Format("step record", 2, frozenset({2}))


class NewerFormat(Exception):
    """A record written by newer code than this worker's: the run is handed back to a worker
    that reads it, never failed by this one. Not a ValueError: nothing catches it as an
    unreadable record."""

    def __init__(self, run_id: str, format: Format, found: int) -> None:
        super().__init__(
            f"run {run_id}: its {format.record} is of format {found}, newer than this worker "
            f"reads ({sorted(format.reads)}): handed back for a worker of newer code"
        )
        self.run_id = run_id
        self.record = format.record
        self.found = found


__all__ = ["CHECKPOINT", "DEFINITION", "PIN", "STEP_RECORD", "Format", "NewerFormat"]
