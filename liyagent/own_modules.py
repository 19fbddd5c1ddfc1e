"""liyagent's own top-level modules, and making their names mean liyagent's files in the
processes liyagent runs (workers, beat, Flower, the CLI), whatever a team's directory holds.

liyagent installs its engine as top-level modules (`tasks`, `runtime`, `store`, `front`,
`simulators`, `celeryconfig`, `beat_schedule`: the layout its users asked for). Two of those
names are Celery's own conventions: a team's project often has a `tasks.py` or a
`celeryconfig.py`, and Celery puts the working directory first on `sys.path` while it loads an
app, its configuration and its task modules. Started there, `celery -A tasks` loads the team's
module, and liyagent's app, once loaded, would take the team's `celeryconfig`. `pin()` puts a
finder first on `sys.meta_path` that resolves exactly these names to the files installed beside
the `liyagent` package, so liyagent's processes load liyagent's modules and never a team's of
the same name (a team's code in those processes that imports its own `tasks` gets liyagent's:
name it otherwise, or keep it out of `LIYAGENT_TOOLS`).

An app process that imports `liyagent` is the team's own: nothing is pinned there.
"""

from __future__ import annotations

import functools
import importlib.abc
import importlib.machinery
import importlib.util
import sys
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

# Every top-level module liyagent installs besides `liyagent` (pyproject.toml's packages and
# py-modules); tests/unit/cli/test_own_modules.py checks the list against pyproject.toml.
OWN = frozenset(
    {"tasks", "runtime", "store", "front", "simulators", "celeryconfig", "beat_schedule"}
)
# Where they are installed: beside the `liyagent` package (site-packages, or the checkout of
# an editable install).
HOME = str(Path(__file__).resolve().parents[1])


class ForeignModule(ImportError):
    """One of liyagent's module names is a team's module in this process (imported before
    `pin()` ran, or found first where nothing is pinned): it would run the team's module as
    liyagent's. The message names the module, where it is, and what to do."""


class _OwnFinder(importlib.abc.MetaPathFinder):
    """Finds liyagent's top-level names in HOME only; every other name (their submodules
    resolve through their package's own path) is left to the finders after it."""

    def find_spec(
        self,
        fullname: str,
        path: Sequence[str] | None,
        target: ModuleType | None = None,
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname not in OWN:
            return None
        return importlib.machinery.PathFinder.find_spec(fullname, [HOME])


def _origin(name: str) -> str | None:
    """The file liyagent's own module `name` is loaded from (HOME's), or None."""
    spec = importlib.machinery.PathFinder.find_spec(name, [HOME])
    return None if spec is None or spec.origin is None else str(Path(spec.origin).resolve())


def _foreign(name: str) -> str | None:
    """Where this process has, or would take, the module `name` from when that is not
    liyagent's own file; None when it is liyagent's."""
    module = sys.modules.get(name)
    if module is not None:
        where = getattr(module, "__file__", None)
    else:
        spec = importlib.util.find_spec(name)
        if spec is None:
            return "not found (is liyagent installed in this environment?)"
        where = spec.origin
    if where is not None and str(Path(where).resolve()) == _origin(name):
        return None
    return where or "a module with no file"


def _refusal(name: str, where: str, fix: str) -> ForeignModule:
    return ForeignModule(
        f"the module {name!r} here is {where}, not liyagent's own {name!r} (in {HOME}): {fix}"
    )


def pin() -> None:
    """Resolve liyagent's top-level names to HOME in this process from now on (idempotent).
    Raises ForeignModule, saying which module and what to do, when one of those names was
    already imported from elsewhere."""
    for name in sorted(OWN):
        where = _foreign(name) if name in sys.modules else None
        if where is not None:
            raise _refusal(
                name,
                where,
                "it was imported before liyagent's; rename the team's module, or start from a "
                "directory and PYTHONPATH without it",
            )
    if not any(isinstance(finder, _OwnFinder) for finder in sys.meta_path):
        sys.meta_path.insert(0, _OwnFinder())


@functools.cache
def require() -> None:
    """In an app process (the team's own, where nothing is pinned): raise ForeignModule when
    one of liyagent's names is, or would be, a team's module, so `liyagent.client()` says which
    module clashes rather than fail on a confusing ImportError (the client publishes through
    liyagent's Celery app, the top-level package `tasks`, configured by `celeryconfig`).
    Checked once per process (a refusal is not remembered: it is checked again)."""
    for name in sorted(OWN):
        where = _foreign(name)
        if where is not None:
            raise _refusal(
                name,
                where,
                "liyagent's client and services need theirs in this process; rename the "
                "team's module, or import it under its package (e.g. `myteam.tasks`)",
            )
