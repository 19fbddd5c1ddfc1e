"""The seam between a run's attempt and the entry point its run came from.

Every entry kind (`store.entries.EntryKind`) is one module of `runtime/entries/` that says how
its run starts, how its answer is handed on and how it is told of a failure; the attempt holds
only this interface and looks the run's kind up here, so the core names no entry kind. The
entry modules fill the registry when `runtime.entries` is imported (every process that builds
services imports it through the client API); the core's own kinds (delegation, job) are here.

A failure is told to every entry point in the failing statement itself (`store.entries`
`ends_cte`: an A2A task, a cron record and a Teams inbox row are marked failed), so the
interface has no failure method: a failed hand-on is `HandOnRefused`, which fails the run.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

from store.entries import EntryKind
from store.errors import LiyagentError
from store.rows import RunRow

if TYPE_CHECKING:
    from runtime.durable.definition import RunDefinition
from runtime.services import Services


class HandOnRefused(LiyagentError):
    """The entry point refused the answer for good (a 4xx): handing it on again cannot help,
    so the run fails with this reason."""


class EntryPoint(Protocol):
    """How one kind of entry point takes its run's answer."""

    # The kinds this implementation serves.
    kinds: frozenset[EntryKind]
    # Whether the answer leaves Postgres (a post to a service): then it is stored first, and a
    # resume hands that stored answer on, never running the turn again. Otherwise it is stored
    # and handed on in one statement (`store.entries.deliver`).
    outside: bool

    def hand_on(
        self, s: Services, run: RunRow, definition: RunDefinition, text: str
    ) -> dict[str, Any] | None:
        """Hand the stored answer on outside Postgres, once, for an attempt that holds the run,
        to where its sealed definition says (`definition.entry`: never a row a database writer
        could point elsewhere); returns what was sent, kept with the run's entry (None when
        nothing leaves Postgres).
        `ToolInDoubt` leaves it in doubt (the attempt ends as a crash does); `HandOnRefused`
        fails the run."""
        ...


class InPostgres:
    """An entry point whose answer lives in Postgres (the transcript, and the entry's own row
    if it has one): stored and handed on in one statement, nothing to send."""

    outside = False

    def __init__(self, *kinds: EntryKind) -> None:
        self.kinds = frozenset(kinds)

    def hand_on(
        self, s: Services, run: RunRow, definition: RunDefinition, text: str
    ) -> dict[str, Any] | None:
        return None


_points: dict[str, EntryPoint] = {}


def register(point: EntryPoint) -> None:
    """Make `point` the entry point of its kinds (one implementation per kind)."""
    for kind in point.kinds:
        held = _points.get(kind)
        if held is not None and held is not point:
            raise ValueError(f"entry kind {kind} has two entry points: {held!r} and {point!r}")
        _points[kind] = point


def entry_point(run: RunRow) -> EntryPoint:
    """The entry point of the run's kind. A kind that is none of `EntryKind` was named by an
    app through the client API (`start_run(entry_kind=...)`), so it is the client API's. None
    registered is a programming error that names what to import."""
    point = _points.get(run.entry_kind) or _points.get(EntryKind.PLAIN)
    if point is None:
        raise LookupError(
            f"run {run.id}: no entry point for entry kind {run.entry_kind!r} in this process; "
            "a process that runs attempts imports runtime.entries (the client API does), "
            "whose modules register every kind"
        )
    return point


# The core's own kinds: a sub-agent's answer wakes its parent, a job's is its record.
register(InPostgres(EntryKind.DELEGATION, EntryKind.JOB))
