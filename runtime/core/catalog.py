"""The catalog of agents and cron triggers an operator configures (`LIYAGENT_AGENTS_FILE`).

`{"agents": {"support-bot": {"model": {...}, "tools": [...], "system": "...",
                             "description": "...", "definition_policy": "pinned"}},
  "cron": [{"name": "digest", "agent": "support-bot", "input": "...", "every_s": 60}]}`
(`crontab: "*/5 * * * *"` instead of `every_s` fires on minute boundaries). An agent's
`description` is public: the A2A agent card shows it (and nothing else of the agent but its name).
`definition_policy` (`pinned`, the default, or `follow_latest`) says what its runs do when a
worker's code no longer serves the definition they started with (runtime/core/drift.py).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import lru_cache
from pathlib import Path
from typing import Any

from runtime.durable.policy import Policy
from runtime.models.base import ModelError
from runtime.models.specs import check_shape
from runtime.toolbox.tools import AgentDef
from store.errors import LiyagentError


class CatalogError(LiyagentError, ValueError):
    """The catalog is malformed or names an unknown agent; the message says where."""


@dataclass(frozen=True)
class CronTrigger:
    name: str
    # The catalog agent it runs, or (`workflow`) the declared Python workflow it starts with
    # `params` (checked when it fires: the workflows are the tool modules', not the file's).
    agent: str
    input: str
    every_s: int | None
    crontab: str | None
    workflow: str | None = None
    params: dict[str, Any] | None = None

    def slot(self, now: datetime) -> datetime:
        """The scheduled time a fire at `now` belongs to: every beat firing it agrees."""
        epoch = int(now.timestamp())
        step = self.every_s if self.every_s else 60
        return datetime.fromtimestamp(epoch - epoch % step, tz=UTC)


@dataclass(frozen=True)
class Catalog:
    agents: dict[str, AgentDef]
    cron: dict[str, CronTrigger]

    def with_agents(self, declared: dict[str, AgentDef]) -> Catalog:
        """This catalog and the agents declared in Python (tool modules); a name in both is an
        error, never a silent override."""
        both = sorted(set(declared) & set(self.agents))
        if both:
            raise CatalogError(
                f"agents {both} are declared both in the catalog file and in "
                f"{', '.join(sorted({declared[n].origin for n in both}))}; keep one"
            )
        return Catalog({**self.agents, **declared}, self.cron)

    def agent(self, name: str) -> AgentDef:
        found = self.agents.get(name)
        if found is None:
            raise CatalogError(
                f"no agent named {name!r} in the catalog; known: "
                f"{', '.join(sorted(self.agents)) or 'none'}"
            )
        return found


def _agent(name: str, raw: Any) -> AgentDef:
    if not isinstance(raw, dict) or not isinstance(raw.get("model"), dict):
        raise CatalogError(f'agent {name!r} needs a "model" object')
    model = raw["model"]
    # Checked when the catalog loads (no secret, a known provider, its fields); the endpoint
    # against the deployment's profiles when a worker starts and when a run is stored.
    try:
        check_shape(model)
    except ModelError as exc:
        raise CatalogError(f"agent {name!r}: {exc}") from None
    tools = raw.get("tools")
    if tools is not None and not (
        isinstance(tools, list) and all(isinstance(t, str) for t in tools)
    ):
        raise CatalogError(f'agent {name!r}: "tools" must be a list of tool names')
    description = raw.get("description")
    if description is not None and not isinstance(description, str):
        raise CatalogError(f'agent {name!r}: "description" must be text (it is public)')
    policy = raw.get("definition_policy", Policy.PINNED.value)
    if policy not in {p.value for p in Policy}:
        raise CatalogError(
            f'agent {name!r}: "definition_policy" must be one of '
            f"{', '.join(p.value for p in Policy)} (got {policy!r})"
        )
    return AgentDef(
        name,
        dict(model),
        tools,
        raw.get("system"),
        origin="the catalog file",
        description=description,
        definition_policy=Policy(policy),
    )


def _trigger(raw: Any, agents: dict[str, AgentDef]) -> CronTrigger:
    if not isinstance(raw, dict) or not isinstance(raw.get("name"), str):
        raise CatalogError('each cron trigger needs a "name"')
    name = raw["name"]
    flow, params = raw.get("workflow"), raw.get("params") or {}
    if flow is None and "params" in raw:
        raise CatalogError(f'cron trigger {name!r}: "params" are a workflow\'s ("workflow")')
    if flow is not None:
        if (
            not isinstance(flow, str)
            or not flow.strip()
            or "agent" in raw
            or "input" in raw
            or (not isinstance(params, dict))
        ):
            raise CatalogError(
                f'cron trigger {name!r}: "workflow" names a declared workflow (instead of '
                '"agent"), with "params" an object'
            )
    elif raw.get("agent") not in agents:
        raise CatalogError(f"cron trigger {name!r} names no known agent")
    every, crontab = raw.get("every_s"), raw.get("crontab")
    if (every is None) == (crontab is None):
        raise CatalogError(f'cron trigger {name!r} needs exactly one of "every_s" or "crontab"')
    if every is not None and (not isinstance(every, int) or every < 1):
        raise CatalogError(f'cron trigger {name!r}: "every_s" must be a positive integer')
    if crontab is not None and (not isinstance(crontab, str) or len(crontab.split()) != 5):
        raise CatalogError(f'cron trigger {name!r}: "crontab" needs five fields')
    agent = flow if flow is not None else raw["agent"]
    text = str(raw.get("input") or name)
    return CronTrigger(name, agent, text, every, crontab, flow, dict(params) if flow else None)


def parse(raw: Any) -> Catalog:
    if not isinstance(raw, dict):
        raise CatalogError("the catalog is a JSON object")
    try:
        agents = {n: _agent(n, a) for n, a in (raw.get("agents") or {}).items()}
    except ValueError as exc:
        raise CatalogError(str(exc)) from None
    cron = [_trigger(t, agents) for t in raw.get("cron") or []]
    return Catalog(agents, {t.name: t for t in cron})


@lru_cache(maxsize=8)
def _load(path: str, mtime: float) -> Catalog:
    return parse(json.loads(Path(path).read_text()))


def load(path: str) -> Catalog:
    """The catalog at `path` (reloaded when the file changes); empty if there is none."""
    file = Path(path)
    if not file.exists():
        return Catalog({}, {})
    try:
        return _load(str(file.resolve()), file.stat().st_mtime)
    except json.JSONDecodeError as exc:
        raise CatalogError(f"{path}: not valid JSON ({exc})") from None
