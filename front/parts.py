"""The front's parts beyond its core: each entry kind that has routes exports one `FrontPart`
from its own front module, listed in the `liyagent.front_routes` entry-point group of
pyproject.toml (an installed package may add its own). `create_app` loads the group explicitly,
so the front names no kind; a part whose extra is not installed is skipped with one log line
naming the extra, never an ImportError. A deployment that names its parts
(`LIYAGENT_FRONT_PARTS`) gets those alone, and a front that cannot serve one refuses to start.

An entry point's extra is said in its metadata (`teams = "front.teams:PART [teams]"`); one
that names none needs only the front's own packages.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from importlib import metadata

import structlog
from starlette.applications import Starlette
from starlette.routing import BaseRoute

from runtime.base.config import ConfigError
from runtime.base.extras import MissingExtra, need
from runtime.services import Services

log = structlog.get_logger("front")

# The group front parts are registered in (pyproject.toml [project.entry-points]).
GROUP = "liyagent.front_routes"


@dataclass(frozen=True)
class FrontPart:
    """One kind's routes (paths, auth and body limits their own) and what it keeps on the app's
    state for them, made once per app (`setup`: Teams' keys client, A2A's dispatcher)."""

    name: str
    routes: Sequence[BaseRoute]
    setup: Callable[[Starlette, Services], None] | None = None


def _load(declared: metadata.EntryPoint) -> FrontPart:
    """The part `declared` names; MissingExtra when the packages of its extra are missing."""
    extra = declared.extras[0] if declared.extras else "front"
    part = getattr(need(extra, declared.module), declared.attr)
    if not isinstance(part, FrontPart):
        raise TypeError(f"{declared.value} ({GROUP}) is not a FrontPart")
    return part


def installed(
    declared: Iterable[metadata.EntryPoint] | None = None, demanded: Sequence[str] = ()
) -> list[FrontPart]:
    """Every part of the group (or of `declared`) whose extra is installed, by name; each
    other one is logged once, with the extra that would bring it. With `demanded` (the
    deployment's LIYAGENT_FRONT_PARTS), those parts alone: MissingExtra when one's extra is
    not installed, ConfigError when no entry point declares one."""
    found = metadata.entry_points(group=GROUP) if declared is None else declared
    if demanded:
        return _demanded(list(found), demanded)
    parts: list[FrontPart] = []
    for entry in sorted(found, key=lambda e: e.name):
        try:
            parts.append(_load(entry))
        except MissingExtra as exc:
            log.warning(
                "front.part_skipped",
                part=entry.name,
                extra=exc.extra,
                next=f"pip install 'liyagent[{exc.extra}]' to serve its routes",
            )
    return parts


def _demanded(found: Sequence[metadata.EntryPoint], demanded: Sequence[str]) -> list[FrontPart]:
    """The parts a deployment named, each loaded or refused (never skipped)."""
    by_name = {entry.name: entry for entry in found}
    unknown = sorted(set(demanded) - set(by_name))
    if unknown:
        raise ConfigError(
            f"LIYAGENT_FRONT_PARTS names {', '.join(unknown)}, which no installed package "
            f"declares in {GROUP!r}; the parts are: {', '.join(sorted(by_name)) or 'none'}"
        )
    return [_load(by_name[name]) for name in sorted(set(demanded))]
