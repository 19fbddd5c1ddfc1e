"""What of the deployment's code and settings a run pins beyond its tools (runtime/durable/
pins.py), read where both are known: which of two versions of the code is the newer (each
worker notes its own when it starts, store/pins.py `code_versions`, the time the fleet first
ran it, so a run that follows the latest definition is re-pinned only forward,
runtime/core/drift.py; a version no worker ever ran, an app process's of its own, is older
than any), and the model a run asks where its spec leaves it to the deployment. Its own
module: the door (enqueue), the attempt and `deploy check` all use it."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import sqlalchemy as sa

from runtime.durable.pins import Declared, PinnedModel, code_version, digest
from runtime.models import specs
from runtime.models.base import ModelError
from store.pins import newer_code, note_code

# The code versions this process has noted, by database: once each.
_noted: set[tuple[str, str]] = set()


def deployment_version(code: Declared, profiles: Mapping[str, Any]) -> str:
    """Names the code (`code_version`) with what of the settings a pin names: each model
    profile's default model. What a run's pin names and the fleet orders."""
    defaults = {name: getattr(p, "model", None) for name, p in sorted(profiles.items())}
    return digest([code_version(code), defaults])


def noted_version(engine: sa.Engine, code: Declared, profiles: Mapping[str, Any]) -> str:
    """This worker's deployment version, noted once (the first worker of a deploy to start
    notes when the fleet first ran it; the others find it)."""
    version = deployment_version(code, profiles)
    where = (engine.url.render_as_string(), version)
    if where not in _noted:
        with engine.begin() as conn:
            note_code(conn, version)
        _noted.add(where)
    return version


def newer_than(
    engine: sa.Engine, code: Declared, profiles: Mapping[str, Any], pinned: str | None
) -> bool:
    """Whether this deployment (`code` with `profiles`) is newer than the version `pinned` (a
    pin of before versions: yes; the same version: yes)."""
    mine = noted_version(engine, code, profiles)
    if pinned is None or pinned == mine:
        return True
    with engine.connect() as conn:
        newer = newer_code(conn, mine, pinned)
        if newer is None:  # noted by this process, the row gone since: noted again
            note_code(conn, mine)
            newer = newer_code(conn, mine, pinned)
    return bool(newer)


def pinned_model(
    spec: Mapping[str, Any], profiles: Mapping[str, Any], code: Declared, agent: str
) -> PinnedModel | None:
    """The model a run of `spec` asks under these profiles and this code, when it is theirs
    to say (None: the spec names its model itself, or it asks none by name)."""
    try:
        checked = specs.check(dict(spec), dict(profiles))
        if isinstance(checked, specs.EndpointSpec):
            if checked.model is not None:
                return None
            return PinnedModel(checked.model_name(checked.endpoint(dict(profiles))), True)
    except ModelError:
        return None
    if isinstance(checked, specs.FrameworkSpec):
        name = code.declared_model(agent)
        return None if name is None else PinnedModel(name, False)
    return None
