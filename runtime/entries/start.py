"""What every entry kind shares: the agents an entry may start (the catalog file's and those
declared in tool modules, looked up in one place) and the one start, through the enqueue door
(`runtime/core/enqueue.py`), idempotent by the entry's request key."""

from __future__ import annotations

from typing import Any

from runtime.base.settings import Settings
from runtime.core import catalog
from runtime.core.deps import DoorDeps
from runtime.core.enqueue import BadRequest, NewRun, enqueue
from runtime.core.entry import Policy
from runtime.services import Services
from runtime.toolbox.tools import AgentDef, ToolRegistry
from runtime.toolbox.workflow_kinds import start_spec
from store.entry_links import EntryLink
from store.rows import RunId

# The spec's entry-point runs (a webhook, a ticket event, a co-pilot or Teams turn, a cron
# fire): the catalog's agent, written ahead only under TICKETIQ_CRASH_RESUME_ENTRIES.
ENTRY_POINT_RUN = Policy(from_catalog=True, written_ahead_by_setting=True)


class UnknownAgent(BadRequest):
    """No agent of that name is declared (the message lists the known ones); nothing stored."""


def agents(settings: Settings, tools: ToolRegistry) -> catalog.Catalog:
    """The catalog file's agents and triggers, with the agents declared in tool modules; a
    catalog that cannot be read raises its `CatalogError` (a ValueError)."""
    return catalog.load(settings.agents_file).with_agents(tools.agents)


def catalog_agent(settings: Settings, tools: ToolRegistry, name: str) -> AgentDef:
    """The declared agent `name`: `UnknownAgent` when there is none; a catalog that cannot be
    read raises its `CatalogError`."""
    found = agents(settings, tools)
    try:
        return found.agent(name)
    except catalog.CatalogError as exc:
        raise UnknownAgent(str(exc)) from None


def entry_target(s: Services, name: str) -> bool:
    """Whether an entry's `name` starts a declared Python workflow (True) or a catalog agent
    (False); an agent of that name wins. UnknownAgent naming both kinds when neither has it;
    a catalog that cannot be read raises its `CatalogError`."""
    found = agents(s.settings, s.tools)
    if name in found.agents or name not in s.tools.workflows:
        try:
            found.agent(name)
        except catalog.CatalogError as exc:
            known = ", ".join(sorted(s.tools.workflows)) or "none"
            raise UnknownAgent(f"{exc}; nor a declared workflow (known: {known})") from None
        return False
    return True


def start_entry(
    s: Services,
    *,
    entry_kind: str,
    agent: str,
    user_input: str,
    request_key: str,
    owner: str,
    channel: str,
    entry: dict[str, Any] | None = None,
    link: EntryLink | None = None,
    principal: str | None = None,
    flow_params: dict[str, Any] | None = None,
) -> tuple[RunId, bool]:
    """Start a catalog agent's run for an entry point, idempotently by its request key within
    `principal`'s (the front token's; None inside the deployment); the run's model, tools and
    system prompt are the agent's. A name no agent has but a declared workflow does starts
    that workflow with `flow_params` (its entry's fields; None: not one that may start a
    workflow). BadRequest for an unknown name or a catalog that cannot be read."""
    try:
        if flow_params is not None and entry_target(s, agent):
            return start_flow_entry(
                s, entry_kind=entry_kind, workflow=agent, params=flow_params,
                request_key=request_key, owner=owner, channel=channel, entry=entry, link=link,
                principal=principal,
            )  # fmt: skip
        definition = catalog_agent(s.settings, s.tools, agent)
    except catalog.CatalogError as exc:
        raise BadRequest(str(exc)) from None
    return enqueue(
        DoorDeps.of(s),
        NewRun(
            agent=agent,
            user_input=user_input,
            model=definition.model,
            tools=definition.tools,
            system=definition.system,
            output=definition.output_schema(),
            definition_policy=definition.definition_policy,
            owner=owner,
            principal=principal,
            entry_kind=entry_kind,
            channel=channel,
            request_key=request_key,
            entry=entry,
            link=link,
        ),
    )


def start_flow_entry(
    s: Services,
    *,
    entry_kind: str,
    workflow: str,
    params: dict[str, Any],
    request_key: str,
    owner: str,
    channel: str,
    entry: dict[str, Any] | None = None,
    link: EntryLink | None = None,
    principal: str | None = None,
) -> tuple[RunId, bool]:
    """Start a declared Python workflow's run for an entry point (a cron trigger, a webhook or
    a ticket event that names one), idempotently by its request key within `principal`'s;
    BadRequest for an unknown workflow or parameters that do not fit (nothing stored)."""
    name, spec, text = start_spec(workflow, None, params, None)
    return enqueue(
        DoorDeps.of(s),
        NewRun(
            agent=name,
            user_input=text,
            workflow=spec,
            may_wait=True,
            owner=owner,
            principal=principal,
            entry_kind=entry_kind,
            channel=channel,
            request_key=request_key,
            entry=entry,
            link=link,
        ),
    )
