"""Process-wide state in one home: every cache, singleton and flag a module keeps for the life
of its process is listed in `STATE`, with what a forked child does with it and why, and the
one fork hook applies that list. A prefork worker's children, an app forked by its server and
`os.fork` all pass through `_in_child` (`os.register_at_fork`), and Celery's
`worker_process_init` calls `child_started` to make sure of it. A module keeps its state in a
`Cache` or `ThreadLocal` (reset by what its row says) or names a `reset` function below
runtime (the store's engines); tests/unit/test_process_state.py refuses a module-level cache,
lock, thread-local, `global` or fork hook that `STATE` does not list.

Resets run in the child's one thread, right after the fork: they take no lock another thread
of the parent may have held (a held lock stays held forever in the child), they replace it."""

from __future__ import annotations

import os
import sys
import threading
import weakref
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from enum import StrEnum
from typing import Generic, Protocol, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class AtFork(StrEnum):
    """What a forked child does with a piece of its parent's state."""

    # The child uses the parent's as it is: immutable values, facts true in any process, or
    # state shared on purpose.
    KEEP = "keep"
    # The child starts empty; the parent's entries are dropped without closing anything (the
    # parent still uses their sockets, threads or tokens).
    FORGET = "forget"
    # The child drops the parent's entries and closes its own copies of their sockets, so the
    # parent's connections close when the parent dies (its death is then seen).
    CLOSE = "close"


@dataclass(frozen=True)
class State:
    """One module's piece of process-wide state: its names, what a forked child does with it,
    why, and (state that is no `Cache` or `ThreadLocal`) the module's function that does it."""

    module: str
    names: tuple[str, ...]
    at_fork: AtFork
    why: str
    reset: str = ""


# Every piece of process-wide state, bottom to top. A new one gets a row here.
STATE: tuple[State, ...] = (
    State(
        "store.db",
        ("_lock", "_engines"),
        AtFork.FORGET,
        "a child opens its own Postgres connections; the parent's engines are disposed with "
        "close=False (SQLAlchemy's rule: the parent still uses those sockets)",
        reset="forget_after_fork",
    ),
    State("store.db", ("sql",), AtFork.KEEP, "built statements: immutable text clauses"),
    State(
        "runtime.core.code_versions",
        ("_noted",),
        AtFork.KEEP,
        "code versions noted in Postgres: a row the parent wrote is there for the child too",
    ),
    State(
        "runtime.durable.pins",
        ("_VERSIONS",),
        AtFork.KEEP,
        "each loaded code's version, a digest of its declarations: the child loaded the same",
    ),
    State(
        "runtime.base.settings",
        ("get_settings",),
        AtFork.KEEP,
        "read from the environment, which the child inherits unchanged",
    ),
    State(
        "runtime.base.redis_clients",
        ("_lock", "_managers"),
        AtFork.KEEP,
        "Sentinel managers: redis-py's pools reopen their connections in a new process",
    ),
    State(
        "runtime.base.tracing",
        ("_live",),
        AtFork.FORGET,
        "a child's exit flushes only the tracers it built; inherited ones are their owner's",
    ),
    State(
        "runtime.base.tracing",
        ("_next",),
        AtFork.KEEP,
        "the ids preset for a thread's next span, set and read within one block",
    ),
    State(
        "runtime.base.changes",
        ("RunChanges",),
        AtFork.FORGET,
        "each instance's publisher thread is gone in a child (threads do not survive a fork): "
        "its first nudge there starts its own",
    ),
    State(
        "runtime.base.faults",
        ("_lock", "_hits"),
        AtFork.KEEP,
        "a fault point fires once per worker: counts of the main process hold for its children",
    ),
    State(
        "runtime.base.sealing",
        ("_warned",),
        AtFork.KEEP,
        "a development key file warned about is not warned about again by a child",
    ),
    State(
        "runtime.base.drain",
        ("_event",),
        AtFork.KEEP,
        "made by the worker's main process before the pool forks, so its children share it",
    ),
    State(
        "runtime.base.pools",
        ("_worker",),
        AtFork.KEEP,
        "noted by the worker's main process before it forks: children size their pools by it",
    ),
    State(
        "runtime.sending.http",
        ("_tls_lock", "_tls"),
        AtFork.KEEP,
        "a TLS context holds certificates, no connection (loading the roots costs 23 ms)",
    ),
    State(
        "runtime.sending.http",
        ("_local",),
        AtFork.FORGET,
        "each thread's pooled clients hold the parent's sockets: a child opens its own",
    ),
    State(
        "runtime.sending.traffic",
        ("_audit_lock", "_audit_installed"),
        AtFork.KEEP,
        "an audit hook survives a fork (and cannot be removed): one per process tree",
    ),
    State(
        "runtime.models.profiles",
        ("parse",),
        AtFork.KEEP,
        "parsed model profiles: values read from the environment",
    ),
    State(
        "runtime.models.prices",
        ("parse",),
        AtFork.KEEP,
        "the parsed price table: values read from the environment",
    ),
    State(
        "runtime.toolbox.coroutines",
        ("_here",),
        AtFork.FORGET,
        "a kept loop's selector and its helper thread are the parent's: a child makes its own",
    ),
    State(
        "runtime.frameworks.calls",
        ("PerThread",),
        AtFork.FORGET,
        "each instance's values are SDK clients bound to a parent's thread, loop and sockets",
    ),
    State("runtime.fleet.scripts", ("source",), AtFork.KEEP, "the Lua scripts' text"),
    State("runtime.flow.gate", ("source",), AtFork.KEEP, "the flow control's Lua scripts' text"),
    State(
        "runtime.fleet.drops",
        ("DropWatch",),
        AtFork.CLOSE,
        "each instance's subscriber thread is gone in a child and its socket is the parent's "
        "(closed here): the child's heartbeat starts its own with its first lease",
    ),
    State(
        "runtime.flow.closes",
        ("Closes",),
        AtFork.CLOSE,
        "each instance's subscriber thread is gone in a child and its socket is the parent's "
        "(closed here, the map dropped): the child's first model call starts its own, which "
        "reads the closes in force anew",
    ),
    State(
        "runtime.flow.limits",
        ("Limiter",),
        AtFork.FORGET,
        "each instance's pending settlements are its parent's requests (the parent settles "
        "them) and its flush timer thread is gone in a child: the child starts with none",
    ),
    State(
        "runtime.services",
        ("_registry_lock", "_registries"),
        AtFork.KEEP,
        "tools loaded before the pool forks serve its children (declarations, no connection)",
    ),
    State(
        "runtime.services",
        ("_services",),
        AtFork.CLOSE,
        "the parent's services: their Redis sockets (the pool's, the presence connection) are "
        "closed here, so a dead parent's connections close; the child builds its own",
    ),
    State(
        "runtime.core.catalog",
        ("_load",),
        AtFork.KEEP,
        "a catalog file's contents, by path and modification time",
    ),
    State("runtime.core.entry", ("_lock", "_points"), AtFork.KEEP, "the entry points installed"),
    State(
        "runtime.core.budget_gate",
        ("_known",),
        AtFork.KEEP,
        "whether the deployment has agent or tenant budgets, as last read (a fact, re-read)",
    ),
    State(
        "runtime.entries.teams.connector",
        ("_tokens",),
        AtFork.FORGET,
        "the bot's tokens: each process asks for its own",
    ),
    State(
        "runtime.entries.teams.settings",
        ("teams_settings",),
        AtFork.KEEP,
        "read from the environment, which the child inherits unchanged",
    ),
    State(
        "runtime.entries.teams.ids",
        ("_lock", "_kept"),
        AtFork.KEEP,
        "Graph ids Microsoft gave: facts, true in any process",
    ),
    State(
        "tasks.services",
        ("_deps",),
        AtFork.FORGET,
        "what an attempt uses of the parent's services (closed by runtime.services' row); "
        "the child takes its own from the services it builds",
    ),
    State(
        "tasks.worker",
        ("_main_pid",),
        AtFork.KEEP,
        "noted before the pool forks, so children know the main process's holder",
    ),
    State(
        "tasks.worker",
        ("_watch", "_sweeps"),
        AtFork.KEEP,
        "the main process's death watch and sweeps: a child neither starts nor reads them",
    ),
    State(
        "liyagent.own_modules",
        ("require",),
        AtFork.KEEP,
        "the modules a process imported, which a child has too",
    ),
)


def declared(module: str, name: str) -> State:
    """The row of `module`'s `name`; LookupError, saying where to declare it, if none."""
    for state in STATE:
        if state.module == module and name in state.names:
            return state
    raise LookupError(
        f"{module}:{name} is process-wide state: give it a row in runtime/base/process.py"
    )


class InChild(Protocol):
    """State that knows how to start over in a forked child."""

    def in_child(self) -> None: ...


_tracked: weakref.WeakSet[InChild] = weakref.WeakSet()


def track(module: str, name: str, state: InChild) -> None:
    """Have `state` (declared as `module`'s `name`) start over in each forked child: an object
    that holds threads or sockets and may outlive a fork (e.g. one a module-level agent keeps)."""
    declared(module, name)
    _tracked.add(state)


class Cache(Generic[K, V]):
    """A lock-guarded map that lives as long as its process, as its `STATE` row says at fork;
    `on_drop` closes, in a child only, what an entry of the parent holds (`AtFork.CLOSE`)."""

    def __init__(self, module: str, name: str, on_drop: Callable[[V], None] | None = None) -> None:
        self.at_fork = declared(module, name).at_fork
        self.on_drop = on_drop
        self.lock = threading.Lock()
        self.items: dict[K, V] = {}
        _tracked.add(self)

    def get(self, key: K, make: Callable[[], V]) -> V:
        """The entry for `key`, made (under the lock: once per process) if there is none."""
        with self.lock:
            found = self.items.get(key)
            if found is None:
                found = self.items[key] = make()
            return found

    def take_all(self) -> list[V]:
        """Every entry, now removed."""
        with self.lock:
            taken = list(self.items.values())
            self.items.clear()
        return taken

    def in_child(self) -> None:
        if self.at_fork == AtFork.KEEP:
            return
        inherited, self.items, self.lock = list(self.items.values()), {}, threading.Lock()
        if self.at_fork == AtFork.CLOSE and self.on_drop is not None:
            for value in inherited:
                self.on_drop(value)


class ThreadLocal(threading.local):
    """A `threading.local` whose values a forked child forgets (`AtFork.FORGET`): the thread
    that forked lives on in the child with its values, which may hold the parent's sockets."""

    def __init__(self, module: str, name: str) -> None:
        if declared(module, name).at_fork != AtFork.FORGET:
            raise ValueError(f"{module}:{name}: a ThreadLocal is forgotten at fork")
        _tracked.add(self)

    def in_child(self) -> None:
        self.__dict__.clear()  # the child's one thread: the one that forked


_reset_in = os.getpid()  # the process whose state is its own (set again in each child)


def _in_child() -> None:
    """Right after a fork, in the child: every tracked state, and each listed `reset` function
    of a module the child has loaded, as `STATE` says."""
    global _reset_in
    _reset_in = os.getpid()
    for state in list(_tracked):
        state.in_child()
    for row in STATE:
        module = sys.modules.get(row.module) if row.reset else None
        if module is not None:
            getattr(module, row.reset)()


def child_started() -> None:
    """For a pool's child start (Celery's `worker_process_init`): the resets, unless the fork
    hook already ran them in this process."""
    if _reset_in != os.getpid():
        _in_child()


os.register_at_fork(after_in_child=_in_child)
