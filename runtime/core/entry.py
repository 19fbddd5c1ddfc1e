"""The seam between a run's attempt and the entry point its run came from.

Every entry kind (`EntryKindName`, its registered name) is one module of `runtime/entries/` (or
a package, as Teams) that says how
its run starts, how its answer is handed on and how it is told of a failure, and its whole
policy (`Policy`: may its runs wait, does their definition come from the catalog, are they
written ahead only under TICKETIQ_CRASH_RESUME_ENTRIES) with its settings type (read from the
environment by the kind, never fields of the base `Settings`). The core holds only this
interface and asks the run's kind here, so it names no entry kind and keeps no list of kinds.
Entry points are registered explicitly, as tools are: the `liyagent.entries` entry-point group (the
package's own in pyproject.toml, and any installed package's), loaded once per process on
first use; the core's own kinds (delegation, job) are here.

A failure is told to every entry point in the failing statement itself (`store.entries`
`ends_cte`, from each kind's store module: an A2A task, a cron record and a Teams inbox row
are marked failed), so the
interface has no failure method: a failed hand-on is `HandOnRefused`, which fails the run.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from importlib import metadata
from typing import TYPE_CHECKING, Any, NewType, Protocol

import sqlalchemy as sa

from runtime.base.settings import Settings
from store.entries import EntryKind
from store.errors import LiyagentError
from store.rows import RunRow

if TYPE_CHECKING:
    from runtime.durable.definition import RunDefinition
from runtime.services import Services

# An entry kind: one of the core's own (`EntryKind`) or the name a registered entry point
# serves (`runs.entry_kind`, unchanged); a kind no package registers is the client API's.
EntryKindName = NewType("EntryKindName", str)


@dataclass(frozen=True)
class HandOnDeps:
    """What handing an answer on uses: the store (the entry's own row: where to post) and the
    settings (its timings: how long a post may take), not the whole `Services`."""

    engine: sa.Engine
    settings: Settings

    @classmethod
    def of(cls, s: Services) -> HandOnDeps:
        """The fields of a process's assembly that a hand-on uses."""
        return cls(engine=s.engine, settings=s.settings)


class HandOnRefused(LiyagentError):
    """The entry point refused the answer for good (a 4xx): handing it on again cannot help,
    so the run fails with this reason."""


@dataclass(frozen=True)
class Policy:
    """What the core asks of an entry kind's runs."""

    # Its runs may suspend (wait for an approval or a child without holding a worker) unless
    # the caller says otherwise.
    may_wait: bool = False
    # Its runs' definitions (model, tools, system prompt) come from the catalog, not the
    # caller: they are no part of what identifies a request (an edit of the catalog between
    # two deliveries of one event does not make the second another request).
    from_catalog: bool = False
    # Its runs that may not wait are written ahead only when TICKETIQ_CRASH_RESUME_ENTRIES is
    # true (the spec's entry-point runs); otherwise always.
    written_ahead_by_setting: bool = False


class EntrySettings(Protocol):
    """An entry kind's own settings, read from the environment (a bad value: `ConfigError`)."""

    @classmethod
    def from_env(cls) -> EntrySettings: ...


class EntryPoint(Protocol):
    """How one kind of entry point's runs start and take their answer."""

    # The kinds this implementation serves.
    kinds: frozenset[str]
    # Whether the answer leaves Postgres (a post to a service): then it is stored first, and a
    # resume hands that stored answer on, never running the turn again. Otherwise it is stored
    # and handed on in one statement (`store.entries.deliver`).
    outside: bool
    # Its runs' policy (`Policy`).
    policy: Policy
    # Its own settings (None: it has none), checked when a process starts (`entry_settings`).
    settings_type: type[EntrySettings] | None

    def hand_on(
        self, s: HandOnDeps, run: RunRow, definition: RunDefinition, text: str
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
    settings_type: type[EntrySettings] | None = None

    def __init__(self, *kinds: str, policy: Policy | None = None) -> None:
        self.kinds = frozenset(kinds)
        self.policy = policy or Policy()

    def hand_on(
        self, s: HandOnDeps, run: RunRow, definition: RunDefinition, text: str
    ) -> dict[str, Any] | None:
        return None


# The group packages register their entry points in (pyproject.toml [project.entry-points]).
GROUP = "liyagent.entries"
# The core's own kinds: a sub-agent's answer wakes its parent, a job's is its record.
CORE = InPostgres(EntryKind.DELEGATION, EntryKind.JOB, policy=Policy(may_wait=True))
_lock = threading.Lock()
_points: dict[str, EntryPoint] = {}


def _registered() -> dict[str, EntryPoint]:
    """Every kind's entry point: the core's and the `liyagent.entries` group's, loaded once
    per process. Two for one kind is a packaging error, said with both names."""
    with _lock:
        if not _points:
            found: dict[str, EntryPoint] = {k: CORE for k in CORE.kinds}
            for declared in metadata.entry_points(group=GROUP):
                point: EntryPoint = declared.load()
                for kind in point.kinds:
                    held = found.get(kind)
                    if held is not None and held is not point:
                        raise ValueError(
                            f"entry kind {kind} has two entry points: {held!r} and "
                            f"{declared.value} ({GROUP})"
                        )
                    found[kind] = point
            _points.update(found)
        return _points


def entry_point_of(kind: str) -> EntryPoint:
    """The entry point of runs of `kind`. A kind no package registers was named by an app
    through the client API (`start_run(entry_kind=...)`), so it is the client API's. None
    registered at all is an installation error, said with what to reinstall."""
    points = _registered()
    point = points.get(kind) or points.get(EntryKind.PLAIN)
    if point is None:
        raise LookupError(
            f"no entry point for entry kind {kind!r}: the {GROUP!r} entry points are not "
            "installed; install liyagent (pip install -e .) so its package metadata lists them"
        )
    return point


def registered_kinds() -> frozenset[str]:
    """Every kind an installed entry point serves, the core's own with them."""
    return frozenset(_registered())


def entry_point(run: RunRow) -> EntryPoint:
    """The entry point of the run's kind (`entry_point_of`)."""
    return entry_point_of(run.entry_kind)


def entry_settings() -> list[EntrySettings]:
    """Every registered kind's own settings as the environment gives them now, so a process
    refuses to start on a bad value (`runtime/ops/startup.py`) rather than fail the kind's
    runs later; a `ConfigError` names the variable."""
    types = {p.settings_type for p in _registered().values() if p.settings_type is not None}
    return [t.from_env() for t in sorted(types, key=lambda t: t.__qualname__)]
