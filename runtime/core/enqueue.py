"""Creating a run: one statement inserts it with its step-0 checkpoint, then its message is
published (a hint: if publishing fails, the sweeper publishes it from Postgres)."""

from __future__ import annotations

import hashlib
import json
import re
import uuid
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import pydantic
import sqlalchemy as sa
import structlog

from runtime.base.changes import RunChanges
from runtime.base.refused import BadRequest as BadRequest
from runtime.base.tenancy import NORMAL, PRIORITIES, TENANT_MAX_CHARS
from runtime.base.tracing import new_run_trace
from runtime.base.validation import described
from runtime.core.code_versions import deployment_version, pinned_model
from runtime.core.deps import DoorDeps
from runtime.core.entry import entry_point_of
from runtime.durable.definition import RunDefinition
from runtime.durable.pins import Pin, Policy
from runtime.durable.state import RunState
from runtime.durable.workflow_spec import validate_workflow
from runtime.flow import budgets, tenants
from runtime.models import specs
from runtime.models.base import ModelError
from runtime.models.output import OUTPUT_TOOL, checked_schema
from runtime.models.profiles import ModelProfile
from runtime.services import Publisher
from runtime.toolbox.tools import AgentDef, ToolRegistry
from store.budgets import run_budget_params
from store.db import to_json
from store.entries import EntryKind
from store.entry_links import EntryLink
from store.rows import FencedOut, RequestKeyConflict, RunId
from store.runs import insert_run
from store.states import RunKind
from store.waits import hold_owner

log = structlog.get_logger(__name__)


# The one rule for agent (and workflow) names, shared by the CLI, the client API and the front:
# a name is part of request keys that another part follows (`webhook:<agent>:<event>`), so it
# has no colon.
AGENT_NAME = re.compile(r"[A-Za-z0-9._-]{1,200}")


def parse_agent(raw: str, what: str = "agent name") -> str:
    """An agent name by the one rule the CLI and the front share (BadRequest otherwise)."""
    if not AGENT_NAME.fullmatch(raw):
        raise BadRequest(
            f"{what} {raw[:80]!r} must be 1-200 letters, digits, '.', '_' or '-' "
            "(no spaces or colons); nothing was stored"
        )
    return raw


class RequestConflict(BadRequest):
    """The request key already names one of the caller's runs, started with another request
    (HTTP 409, CLI 2); it names that run and nothing of the request that started it."""

    def __init__(self, conflict: RequestKeyConflict) -> None:
        super().__init__(str(conflict))
        self.run_id = conflict.run_id


@dataclass(frozen=True)
class NewRun:
    agent: str
    user_input: str
    model: dict[str, Any] = field(default_factory=dict)
    workflow: dict[str, Any] | None = None
    owner: str = "app"
    # The front principal whose token asks for it (None inside the deployment): it scopes the
    # request key and who may read the run through the front (store/scope.py).
    principal: str | None = None
    # An `EntryKind`, a registered entry point's kind, or a kind of its own an app names
    # through the client API.
    entry_kind: str = EntryKind.PLAIN
    channel: str = "api"
    run_as: str | None = None
    tools: list[str] | None = None
    system: str | None = None
    request_key: str | None = None
    parent_run_id: str | None = None
    # The parent's attempt that delegates: the child is stored only while it owns the parent.
    parent_attempt: int | None = None
    may_wait: bool | None = None
    # Where the answer goes beyond the transcript (e.g. a Teams conversation).
    entry: dict[str, Any] | None = None
    link: EntryLink | None = None
    job: dict[str, Any] | None = None
    resumable: bool | None = None
    # The JSON schema of the type the run's final answer must be (runtime/models/output.py).
    output: dict[str, Any] | None = None
    # The model spec as a `RunRequest` checked it at the door: not checked again.
    checked_model: specs.ProviderSpec | None = None
    # Whose share of the fleet it takes (None: its owner's; runtime/flow/tenants.py) and its
    # priority (1 low, 2 normal, 3 high).
    tenant: str | None = None
    priority: int = NORMAL
    # What it may spend (`{"tokens": N, "usd": X}`, either or both; runtime/flow/budgets.py).
    budget: dict[str, Any] | None = None
    # What it does when a worker's code no longer serves its pinned definition (its agent's
    # policy: runtime/durable/pins.py, runtime/core/drift.py).
    definition_policy: Policy = Policy.PINNED


class RunRequest(pydantic.BaseModel):
    """What a caller of the client API asks for when it starts an agent run, validated once
    at the door (field types, the agent's name, the model spec for its provider); the tools
    are checked against this deployment's registry when the run is enqueued."""

    model_config = pydantic.ConfigDict(extra="forbid", frozen=True)

    agent: pydantic.StrictStr
    user_input: pydantic.StrictStr
    # Stored as given (it is part of the request's digest); checked by `runtime/models/specs.py`.
    model: dict[str, Any]
    tools: list[pydantic.StrictStr] | None = None
    system: pydantic.StrictStr | None = None
    request_key: pydantic.StrictStr | None = None
    owner: pydantic.StrictStr = "app"
    entry_kind: pydantic.StrictStr = "plain"
    channel: pydantic.StrictStr = "api"
    run_as: pydantic.StrictStr | None = None
    may_wait: pydantic.StrictBool | None = None
    resumable: pydantic.StrictBool | None = None
    # The JSON schema of the type its final answer must be: the model is offered the output
    # tool, and the answer is checked before the run ends (a declared agent's, `start_agent`).
    output: dict[str, Any] | None = None
    # Whose share of the fleet it takes (its owner's unless named) and its priority.
    tenant: pydantic.StrictStr | None = None
    priority: pydantic.StrictInt = NORMAL
    # What it may spend: {"tokens": N, "usd": X}, either or both (runtime/flow/budgets.py).
    budget: dict[str, Any] | None = None
    # What it does when a worker's code no longer serves its pinned definition: "pinned" (wait
    # for a worker that does) or "follow_latest" (take the new one), runtime/core/drift.py.
    definition_policy: Policy = Policy.PINNED
    _spec: specs.ProviderSpec | None = pydantic.PrivateAttr(default=None)

    @classmethod
    def parse(cls, fields: Mapping[str, Any], declared: dict[str, ModelProfile]) -> RunRequest:
        """The request checked (its model against the deployment's profiles `declared`), or
        BadRequest naming each field that is wrong (never a value: a model spec may hold a
        secret) and the fields a request takes."""
        try:
            request = cls.model_validate(dict(fields))
        except pydantic.ValidationError as exc:
            raise BadRequest(
                f"run request: {described(exc, '(request)')}; fields: {sorted(cls.model_fields)}; "
                "nothing was stored"
            ) from None
        parse_agent(request.agent)
        budgets.parse(request.budget)
        request._spec = check_model(request.model, declared)
        return request

    def new_run(self) -> NewRun:
        """The run to enqueue, its model spec marked as checked."""
        return NewRun(**self.model_dump(), checked_model=self._spec)


def _validate(s: DoorDeps, new: NewRun) -> list[str]:
    """Check the request before anything is stored (BadRequest otherwise); returns the tools
    the run may use, exactly."""
    if not new.agent.strip():
        raise BadRequest("agent must be a non-empty name")
    if not new.user_input.strip():
        raise BadRequest("user_input must be non-empty")
    _check_share(new)
    if new.job is not None:
        return checked_tools(s.tools, new.tools, f"job {new.job.get('kind')}")
    if new.workflow is not None and "python" in new.workflow:
        return _checked_flow(s, new.workflow)
    if new.workflow is not None:
        try:
            steps = validate_workflow(new.workflow)
        except ValueError as exc:
            raise BadRequest(str(exc)) from None
        # A workflow's own steps name the tools it calls, and only those.
        return checked_tools(s.tools, sorted({step.tool for step in steps.values()}), "workflow")
    spec = new.checked_model
    if spec is None:
        spec = check_model(new.model, s.model_profiles())
    checked_guest(s.tools, spec)
    tools = checked_tools(s.tools, new.tools, "tools")
    if new.output is not None:
        checked_output(spec, new.output, tools)
    return tools


def _checked_flow(s: DoorDeps, spec: dict[str, Any]) -> list[str]:
    """A Python workflow's start: declared here, its parameters fit and are JSON; the tools
    it may call are the ones it declares, exactly (BadRequest otherwise, nothing stored)."""
    name = spec.get("python")
    kind = s.tools.workflows.get(str(name))
    if kind is None:
        known = ", ".join(sorted(s.tools.workflows)) or "none"
        raise BadRequest(
            f"unknown workflow {name!r} (known here: {known}; a team's own are declared with "
            "@workflow in the modules LIYAGENT_TOOLS names); nothing was stored"
        )
    params = spec.get("params") or {}
    if not isinstance(params, dict):
        raise BadRequest(f"workflow {name}: params must be an object; nothing was stored")
    try:
        json.dumps(params, allow_nan=False)
        kind.check(params)
    except (TypeError, ValueError) as exc:
        raise BadRequest(f"{exc}; nothing was stored") from None
    return checked_tools(s.tools, list(kind.tools), f"workflow {name}")


def _check_share(new: NewRun) -> None:
    """A priority of the three, and a tenant key that names someone (BadRequest otherwise)."""
    if new.priority not in PRIORITIES:
        raise BadRequest(
            f"priority {new.priority!r} must be 1 (low), 2 (normal) or 3 (high); nothing was stored"
        )
    if new.tenant is not None and not 0 < len(new.tenant.strip()) <= TENANT_MAX_CHARS:
        raise BadRequest(
            f"tenant must be 1-{TENANT_MAX_CHARS} characters (leave it out: the run's owner); "
            "nothing was stored"
        )


def checked_output(spec: specs.ProviderSpec, schema: Any, tools: list[str]) -> None:
    """An output type a run can be checked against: a JSON Schema, for a model liyagent's loop
    asks (a framework agent checks its own type), with no tool of the output tool's name."""
    try:
        checked_schema(schema)
    except ValueError as exc:
        raise BadRequest(f"{exc}; nothing was stored") from None
    if isinstance(spec, specs.FrameworkSpec):
        raise BadRequest(
            f"output: the {spec.framework} agent {spec.agent!r} checks its answer against its "
            "own output type; leave output out (start it with start_agent); nothing was stored"
        )
    if OUTPUT_TOOL in tools:
        raise BadRequest(
            f"tools: a run with an output type gives its final answer by calling {OUTPUT_TOOL}, "
            "so no tool of that name may be offered; nothing was stored"
        )


def checked_guest(tools: ToolRegistry, spec: specs.ProviderSpec) -> None:
    """A spec naming a framework agent names one this deployment registered; BadRequest
    listing the registered ones otherwise."""
    if isinstance(spec, specs.FrameworkSpec) and (
        getattr(tools.guests.get(spec.agent), "framework", None) != spec.framework
    ):
        known = ", ".join(f"{g.name} ({g.framework})" for g in tools.guests.values())
        raise BadRequest(
            f"model names the {spec.framework} agent {spec.agent!r}, which no module "
            f"LIYAGENT_TOOLS names registers (registered: {known or 'none'}); nothing was stored"
        )


def check_model(model: Any, declared: dict[str, ModelProfile]) -> specs.ProviderSpec:
    """A model spec a worker can use: no secret in it, and an endpoint only of the deployment's
    profiles `declared` (specs.py); BadRequest otherwise, naming the field, never its value."""
    try:
        return specs.check(model, declared)
    except ModelError as exc:
        raise BadRequest(f"{exc}; nothing was stored") from None


def checked_tools(loaded: ToolRegistry, tools: Any, what: str = "tools") -> list[str]:
    """The tools a run may use, fail closed: exactly the names given (none when none are);
    a name this deployment has not loaded is refused, listing the known ones."""
    if tools is None:
        return []
    if not isinstance(tools, list | tuple) or not all(isinstance(t, str) for t in tools):
        raise BadRequest(f"{what} must be a list of tool names; nothing was stored")
    unknown = loaded.unknown(tools)
    if unknown:
        raise BadRequest(
            f"{what} names tools this deployment has not loaded: {', '.join(unknown)}; known: "
            f"{', '.join(loaded.names())} (tools come from the modules LIYAGENT_TOOLS names, "
            "entry points and LIYAGENT_MCP_SERVERS); nothing was stored"
        )
    return list(dict.fromkeys(tools))


def check_definition(s: DoorDeps, definition: AgentDef) -> None:
    """An agent definition (the catalog's or one declared in Python) a run can be started
    from: its model spec and its tools checked as `enqueue` checks them."""
    check_model(definition.model, s.model_profiles())
    checked_tools(s.tools, definition.tools, f"agent {definition.name}: tools")


def request_digest(new: NewRun) -> str:
    """SHA-256 of what identifies the request a caller made: the agent, the input, who and
    where from, and the parameters the caller chose. An entry point's run takes its model,
    tools and system prompt from the catalog, not from the caller, so an edit of the catalog
    between two deliveries of one event does not make the second a different request."""
    identity: dict[str, Any] = {
        "agent": new.agent,
        "user_input": new.user_input,
        "owner": new.owner,
        "entry_kind": new.entry_kind,
        "channel": new.channel,
        "run_as": new.run_as,
        "parent_run_id": new.parent_run_id,
        "workflow": new.workflow,
        "job": new.job,
    }
    if not entry_point_of(new.entry_kind).policy.from_catalog:
        identity.update(model=new.model, tools=new.tools, system=new.system)
        if new.output is not None:  # absent otherwise: the digests of earlier runs hold
            identity["output"] = new.output
    # Named only when it is not the default (the owner): the digests of runs stored before
    # tenants existed hold, a sub-agent's (its parent's tenant) included.
    if new.tenant is not None and new.tenant != new.owner:
        identity["tenant"] = new.tenant
    if new.priority != NORMAL:
        identity["priority"] = new.priority
    budget = budgets.parse(new.budget)
    if budget is not None:  # absent otherwise: the digests of earlier runs hold
        identity["budget"] = budget.to_json()
    return hashlib.sha256(to_json(identity).encode("utf-8")).hexdigest()


def enqueue(s: DoorDeps, new: NewRun) -> tuple[RunId, bool]:
    """Create the run (or find the one its request key already made for the same principal)
    and publish it. The same key with another request is refused (RequestConflict) and stores
    nothing."""
    tools = _validate(s, new)
    budget = budgets.parse(new.budget) or budgets.Budget()
    run_id = str(uuid.uuid4())
    state = RunState.initial(new.agent, new.system, new.user_input)
    payload = state.to_payload()
    size = len(to_json(payload).encode())
    if size > s.settings.step_max_bytes:
        raise BadRequest(
            f"the run's input and system prompt are {size} bytes, more than "
            f"LIYAGENT_STEP_MAX_BYTES={s.settings.step_max_bytes}; nothing was stored: send "
            "less, or raise the limit"
        )
    sealed = s.sealer.seal(run_id, "checkpoint", 0, payload)
    policy = entry_point_of(new.entry_kind).policy
    may_wait = new.may_wait if new.may_wait is not None else policy.may_wait
    definition = RunDefinition(
        agent=new.agent,
        owner=new.owner,
        entry_kind=new.entry_kind,
        kind=_kind(new).value,
        channel=new.channel,
        run_as=new.run_as,
        parent_run_id=new.parent_run_id,
        correlation_id=run_id,
        resumable=_resumable(s, new, may_wait),
        principal=new.principal,
        model=new.model,
        tools=tools,
        system=new.system,
        may_wait=may_wait,
        entry=new.entry or {},
        workflow=new.workflow,
        job=new.job,
        trace=new_run_trace(run_id),
        output=new.output,
    )
    tenant = new.tenant if new.tenant is not None else new.owner
    # A sub-agent's run is never held: its parent was admitted and waits for it.
    limit = None if new.parent_run_id is not None else s.settings.tenants.limit_of(tenant)
    try:
        with s.engine.connect() as conn, _fenced(conn, new), tenants.door(conn, tenant, limit):
            rid, created, held = insert_run(
                conn,
                run_id=run_id,
                correlation_id=definition.correlation_id,
                request_key=new.request_key,
                agent=definition.agent,
                owner=definition.owner,
                entry_kind=definition.entry_kind,
                definition=definition.seal(s.sealer, run_id),
                user_input=new.user_input,
                sealed_checkpoint=sealed,
                kind=definition.kind,
                channel=definition.channel,
                run_as=definition.run_as,
                parent_run_id=definition.parent_run_id,
                resumable=definition.resumable,
                link=new.link,
                request_digest=request_digest(new),
                principal=definition.principal,
                tenant=tenant,
                priority=new.priority,
                tenant_limit=limit,
                budget=run_budget_params(budget.tokens, budget.usd),
                # What of this process's code it starts against (runtime/durable/pins.py).
                pin=_pin(s, new, tools).seal(s.sealer, run_id),
                on_stop=_on_stop(s, new),
            )
            # Held behind others, or at the bound: the tenant's room (if any) goes to its held
            # runs in their turn, this one among them.
            admitted = tenants.admit_within(conn, tenant, limit) if held else []
    except RequestKeyConflict as exc:
        raise RequestConflict(exc) from None
    if created and not held:
        publish_quietly(s.changes, s.publisher, rid, 1, new.priority)
    for run in admitted:
        publish_quietly(s.changes, s.publisher, run.run_id, run.attempt, run.priority)
    if held and rid not in {run.run_id for run in admitted}:
        log.debug("run.held", run_id=rid, tenant=tenant, limit=limit)
        s.changes.announce(rid)
    return rid, created


def _on_stop(s: DoorDeps, new: NewRun) -> str | None:
    """`compensate` for a declared Python workflow that catches a Stop: a Stop then hands it to
    an attempt that raises it in the function (store/gates.py `insert_stop`); None otherwise."""
    spec = new.workflow or {}
    kind = s.tools.workflows.get(str(spec["python"])) if "python" in spec else None
    return "compensate" if kind is not None and kind.catches_stop else None


def _pin(s: DoorDeps, new: NewRun, tools: list[str]) -> Pin:
    """What of this process's code and deployment the run starts against (runtime/durable/
    pins.py)."""
    profiles = s.model_profiles()
    model = pinned_model(new.model, profiles, s.tools, new.agent)
    version = deployment_version(s.tools, profiles)
    return Pin.of(s.tools, new.agent, tools, new.definition_policy, new.system, model, version)


@contextmanager
def _fenced(conn: sa.Connection, new: NewRun) -> Iterator[None]:
    """A sub-agent's run is stored only while its parent's delegating attempt owns the parent
    (I3): the parent's row is held until the child's insert commits, so a claim or an erasure
    of the parent either comes after and sees the child, or came first and fences it out
    (`FencedOut`: nothing stored)."""
    if new.parent_attempt is None or new.parent_run_id is None:
        yield
        return
    conn.execution_options(isolation_level="READ COMMITTED")
    with conn.begin():
        if not hold_owner(conn, new.parent_run_id, new.parent_attempt):
            raise FencedOut(new.parent_run_id, new.parent_attempt, "start its sub-agent's run")
        yield


def _kind(new: NewRun) -> RunKind:
    if new.job is not None:
        return RunKind.JOB
    return RunKind.WORKFLOW if new.workflow is not None else RunKind.AGENT


def _resumable(s: DoorDeps, new: NewRun, may_wait: bool) -> bool:
    """Runs that may wait are always written ahead; the runs of an entry kind whose policy says
    so only when TICKETIQ_CRASH_RESUME_ENTRIES is true; a job by its kind."""
    if new.resumable is not None:
        return new.resumable
    if entry_point_of(new.entry_kind).policy.written_ahead_by_setting and not may_wait:
        return s.settings.crash_resume_entries
    return True


def publish_quietly(
    changes: RunChanges, publisher: Publisher, run_id: str, attempt: int, priority: int = NORMAL
) -> None:
    """Publish a run's message (a first attempt at its run's `priority`); a failure is logged,
    and Postgres (the outbox) keeps the run. The run's followers are nudged first: whatever
    made this attempt (a start, a hand-back, a wake, a claim, an admission) is committed."""
    changes.announce(run_id)
    try:
        publisher.publish(run_id, attempt, priority)
    except Exception as exc:
        log.warning(
            "run.publish_failed",
            run_id=run_id,
            attempt=attempt,
            error=str(exc),
            next="the sweeper publishes it again once it has waited too long",
        )
