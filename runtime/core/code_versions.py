"""Which of two versions of the deployment's code is the newer: each process notes its own
once (store/pins.py `code_versions`, the time the fleet first saw it), so a run that follows
the latest definition is re-pinned only forward (runtime/core/drift.py), never back to an old
worker's code mid-deploy. Its own module: the door (enqueue) and the attempt both use it."""

from __future__ import annotations

import sqlalchemy as sa

from runtime.durable.pins import Declared, code_version
from store.pins import newer_code, note_code

# The code versions this process has noted, by database: once each.
_noted: set[tuple[str, str]] = set()


def noted_version(engine: sa.Engine, code: Declared) -> str:
    """This process's code version, noted once (the first process of a deploy to start notes
    when the fleet first saw it; the others find it)."""
    version = code_version(code)
    where = (engine.url.render_as_string(), version)
    if where not in _noted:
        with engine.begin() as conn:
            note_code(conn, version)
        _noted.add(where)
    return version


def newer_than(engine: sa.Engine, code: Declared, pinned: str | None) -> bool:
    """Whether `code` is newer than the code version `pinned` (a pin of before versions:
    yes; the same version: yes)."""
    mine = noted_version(engine, code)
    if pinned is None or pinned == mine:
        return True
    with engine.connect() as conn:
        return newer_code(conn, mine, pinned)
