"""The client API app processes use: start runs and workflows, read them, wait for them,
stop them, decide approvals; and the operator's actions the front and the CLI share (stop a
run or an agent, lift a stop, the one "known agent" check).

As an entry kind (`plain`, `managed`, `playground`, `resume`): a run starts with
`Client.start_run` (idempotent by its request key), its answer is handed on in Postgres (stored
on the run and its transcript in one statement, read with `get` or `wait`), and a failure is
told on the run alone (its status and reason)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from runtime.base.tenancy import NORMAL
from runtime.core.catalog import CatalogError
from runtime.core.deps import DoorDeps
from runtime.core.enqueue import (
    AGENT_NAME,
    BadRequest,
    NewRun,
    RequestConflict,
    RunRequest,
    enqueue,
    parse_agent,
    publish_quietly,
)
from runtime.core.entry import InPostgres, Policy
from runtime.entries.start import UnknownAgent, catalog_agent
from runtime.ops.budgets import raise_run_budget, set_budget
from runtime.ops.erasure import Erased, erase
from runtime.ops.events import RECHECK_S, EventPage, RunEvent, follow, read_events
from runtime.ops.run_view import (
    OutputMismatch,
    RunView,
    parse_id,
    read_view,
    resolve_run_id,
    still_waiting,
)
from runtime.ops.signals import publish, send
from runtime.ops.stops import apply_stop
from runtime.services import Services
from runtime.toolbox.tools import AgentDef
from runtime.toolbox.workflow_kinds import start_spec
from store.entries import EntryKind
from store.gates import agent_has_runs, lift_stops
from store.records import select_transcript
from store.rows import ApprovalRow, RunId, RunNotFound, StopRow
from store.runs import get_run
from store.scope import Scope
from store.states import FINISHED
from store.waits import decide_approval, get_approval, list_approvals

ENTRY = InPostgres(
    EntryKind.PLAIN,
    EntryKind.MANAGED,
    EntryKind.PLAYGROUND,
    EntryKind.RESUME,
    policy=Policy(may_wait=True),
)


class AlreadyEnded(BadRequest):
    """A Stop names a run that has ended: there is nothing to stop; nothing stored."""

    def __init__(self, run_id: str, status: str) -> None:
        super().__init__(f"run {run_id} already {status}; there is nothing to stop")
        self.status = status


class NotDecided(BadRequest):
    """A decision that changed nothing: the approval does not exist (`current` None) or was
    decided before (`current` says how and by whom)."""

    def __init__(self, approval_id: str, current: ApprovalRow | None) -> None:
        if current is None:
            super().__init__(f"approval {approval_id} does not exist")
        else:
            super().__init__(
                f"approval {approval_id} was already {current.status} by "
                f"{current.decided_by}; nothing changed"
            )
        self.current = current


@dataclass(frozen=True)
class Stopped:
    """What a Stop did: the runs it failed (every one it covers that had not ended: a run's
    children and theirs with it)."""

    now: list[str]


def parse_after(raw: object) -> int:
    """A sequence number to read a run's events after (a Last-Event-ID, `after=`): a whole
    number, 0 or more; anything else is a BadRequest."""
    text = str(raw).strip()
    if isinstance(raw, bool) or not text.isdigit() or len(text) > 18:
        raise BadRequest(
            f"{raw!r} is not an event sequence number (a whole number, 0 or more: the `seq` of "
            "the last event seen, 0 for all)"
        )
    return int(text)


class Client:
    def __init__(self, services: Services) -> None:
        self.s = services
        # What starting a run uses (the enqueue door's dependencies), taken once.
        self.door = DoorDeps.of(services)

    def start_run(self, request: RunRequest | None = None, /, **fields: Any) -> RunId:
        """Insert the run with its first checkpoint, then publish its message; a request key
        makes this idempotent (the same key with the same request returns the same run and
        publishes nothing; with another request it raises RequestConflict). Takes a
        `RunRequest`, or its fields as keywords (`agent=`, `model=`, `user_input=`, ...),
        validated into one; `output=` a JSON Schema its final answer must fit (the model is
        offered the `final_result` tool; `start_agent` gives a declared agent's own);
        `tenant=` whose share of the fleet it takes (its owner's unless named),
        `priority=` 1 (low), 2 (normal) or 3 (high) (runtime/flow/tenants.py) and `budget=`
        `{"tokens": N, "usd": X}` what it may spend (runtime/flow/budgets.py). The
        run may use exactly `tools=[...]` (none without it); a field
        of the wrong type or unknown, an unknown tool or a bad or secret-bearing model spec is
        a BadRequest naming the field, and nothing is stored."""
        if request is None:
            request = RunRequest.parse(fields, self.s.model_profiles())
        elif fields:
            raise BadRequest(
                f"start_run takes a RunRequest or its fields, not both (got {sorted(fields)}); "
                "nothing was stored"
            )
        return enqueue(self.door, request.new_run())[0]

    def start_agent(
        self,
        name: str,
        user_input: str,
        *,
        request_key: str | None = None,
        owner: str = "app",
        tenant: str | None = None,
        priority: int = NORMAL,
        budget: dict[str, Any] | None = None,
    ) -> RunId:
        """Start a run of a declared agent (the catalog file's, or one a tool module declares:
        `agent(...)`, or a framework's agent registered with `durable(...)`) with its own
        model, tools, system prompt and output type (its answer then read back as that type,
        `RunView.output`); the same request key returns the same run; `tenant` (its owner's
        unless named), `priority` (1 low, 2 normal, 3 high) and `budget` as for `start_run`. An
        unknown name is an `UnknownAgent` (a BadRequest listing the known agents); nothing is
        stored."""
        definition = self.declared_agent(name)
        return self.start_run(
            agent=name,
            model=definition.model,
            user_input=user_input,
            tools=definition.tools,
            system=definition.system,
            request_key=request_key,
            owner=owner,
            output=definition.output_schema(),
            tenant=tenant,
            priority=priority,
            budget=budget,
            definition_policy=definition.definition_policy,
        )

    def declared_agent(self, name: str) -> AgentDef:
        """The agent `name`, declared in the catalog file (`LIYAGENT_AGENTS_FILE`) or in a
        module `LIYAGENT_TOOLS` names; UnknownAgent listing the known ones when there is none."""
        settings = self.s.settings
        try:
            return catalog_agent(settings, self.s.tools, name)
        except (CatalogError, UnknownAgent) as exc:
            raise UnknownAgent(
                f"{exc} (agents come from {settings.agents_file} and the modules LIYAGENT_TOOLS "
                "names); nothing was stored"
            ) from None

    def start_workflow(
        self,
        *,
        workflow: dict[str, Any] | str | Any,
        name: str | None = None,
        params: dict[str, Any] | None = None,
        user_input: str | None = None,
        request_key: str | None = None,
        owner: str = "app",
        tenant: str | None = None,
        priority: int = NORMAL,
    ) -> RunId:
        """Start a workflow run: a declared Python workflow (`@workflow`: the function or its
        name, with its `params`) or a JSON step graph (a dict), on the same durable machinery.
        A request key makes it idempotent; `tenant` and `priority` apply as for `start_run`."""
        try:
            name, spec, text = start_spec(workflow, name, params, user_input)
        except ValueError as exc:
            raise BadRequest(str(exc)) from None
        new = NewRun(
            agent=parse_agent(name, "workflow name"),
            workflow=spec,
            user_input=text,
            request_key=request_key,
            owner=owner,
            tenant=tenant,
            priority=priority,
            may_wait=True if "python" in spec else None,
        )
        return enqueue(self.door, new)[0]

    def signal(
        self,
        run_id: str,
        name: str,
        payload: Any = None,
        *,
        key: str | None = None,
        by: str = "app",
        scope: Scope | None = None,
    ) -> int:
        """Send the run the signal `name` with `payload`, delivered exactly once: a workflow's
        `wait_signal(name)` takes it, an agent run sees it at its next step boundary. `key`
        makes a send idempotent (the same key sends nothing more). Its id; BadRequest when the
        run does not exist or has ended (nothing stored)."""
        return send(self.s, parse_id(run_id), name, payload, key=key, by=by, scope=scope)

    def publish_event(
        self, name: str, payload: Any = None, *, match: str | None = None,
        key: str | None = None, by: str = "app",
    ) -> int:  # fmt: skip
        """Publish the event `name` to every workflow whose `wait_event(name, match)` waits for
        it, now or later (each takes it once); `key` makes a publish idempotent. Its id."""
        return publish(self.s, name, payload, match=match, key=key, by=by)

    def start_job(
        self,
        *,
        kind: str,
        params: dict[str, Any],
        request_key: str | None = None,
        owner: str = "jobs",
    ) -> RunId:
        """Queue a background job for any worker; resumable kinds continue from their cursor.
        Its parameters are checked for its kind first: bad ones store nothing."""
        from runtime.toolbox.job_kinds import JobError

        known = self.s.tools.jobs
        job_kind = known.get(kind)
        if job_kind is None:
            raise BadRequest(
                f"unknown job kind {kind!r}; known: {', '.join(sorted(known))} (a team's own "
                "kinds are declared with @job in the modules LIYAGENT_TOOLS names); nothing "
                "was stored"
            )
        try:
            job_kind.check(params, self.s.settings)
        except JobError as exc:
            raise BadRequest(f"job {kind}: {exc}; nothing was stored") from None
        return enqueue(
            self.door,
            NewRun(
                agent=f"job:{kind}",
                user_input=f"{kind} {json.dumps(params, sort_keys=True)}"[:2000],
                job={"kind": kind, "params": params},
                tools=list(job_kind.tools),
                entry_kind=EntryKind.JOB,
                channel="jobs",
                owner=owner,
                request_key=request_key,
                resumable=job_kind.resumable,
            ),
        )[0]

    def resolve_run_id(self, raw: str) -> str:
        """A full run id, or the one run a unique prefix names (see `resolve_run_id`)."""
        return resolve_run_id(self.s.engine, raw)

    def get(self, run_id: str) -> RunView:
        """The run as it stands, its answer opened with the seal keys and, when its agent
        declares an output type, read as the type this process declares (runtime/ops/run_view.py,
        `read_view`)."""
        return read_view(self.s.engine, self.s.sealer, run_id, self.s.tools)

    def transcript(self, run_id: str) -> list[tuple[str, str]]:
        with self.s.engine.connect() as conn:
            return [(m.role, m.content) for m in select_transcript(conn, parse_id(run_id))]

    def wait(
        self,
        run_id: str,
        timeout_s: float = 60.0,
        poll_s: float = 0.1,
        until: frozenset[str] = FINISHED,
    ) -> RunView:
        """Poll until the run reaches one of `until`; raise TimeoutError with its state."""
        deadline = time.monotonic() + timeout_s
        while True:
            view = self.get(run_id)
            if view.status in until:
                return view
            if time.monotonic() > deadline:
                raise still_waiting(run_id, view, timeout_s)
            time.sleep(poll_s)

    def events(self, run_id: str, after: int = 0) -> EventPage:
        """The run's events after sequence number `after` (0: all of them), as Postgres holds
        them now, with the run's status; RunNotFound for an unknown run. The same event
        always has the same `seq`, and new events only ever follow (runtime/ops/events.py)."""
        return read_events(self.s.engine, parse_id(run_id), parse_after(after))

    def follow(
        self, run_id: str, after: int = 0, recheck_s: float = RECHECK_S
    ) -> Iterator[RunEvent]:
        """Every event of the run after `after`, as it is recorded, ending once the run has
        ended; woken by the engine's nudge, reading again at least every `recheck_s`."""
        run_id, after = parse_id(run_id), parse_after(after)
        with self.s.engine.connect() as conn:
            get_run(conn, run_id)  # RunNotFound now, not at the first iteration
        return follow(self.s.engine, self.s.changes, run_id, after, recheck_s)

    def stop(
        self, *, run_id: str | None = None, agent: str | None = None, reason: str, by: str
    ) -> list[str]:
        """An operator's Stop of one run (with its children and theirs) or of an agent's runs:
        every run it covers fails now (a workflow that catches a Stop compensates first); a
        running one's attempt is fenced out (nothing it tries to write lands) and its request in
        flight cut (runtime/ops/stops.py). Returns the runs failed now."""
        if (run_id is None) == (agent is None):
            raise BadRequest("stop exactly one run (run_id) or one agent (agent)")
        if not reason.strip() or not by.strip():
            raise BadRequest("a stop needs a reason and who stops")
        if run_id is not None:
            run_id = parse_id(run_id)
            view = self.get(run_id)
            if view.done:
                raise AlreadyEnded(run_id, view.status)
        if agent is not None:
            self.known_agent(agent)
        return apply_stop(self.s, run_id=run_id, agent=agent, reason=reason, by=by)

    def stop_run(self, run_id: str, *, reason: str, by: str) -> Stopped:
        """Stop one run that has not ended, with its children and theirs (RunNotFound,
        AlreadyEnded otherwise)."""
        return Stopped(self.stop(run_id=run_id, reason=reason, by=by))

    def stop_agent(self, agent: str, *, reason: str, by: str) -> Stopped:
        """Stop a known agent's runs (UnknownAgent otherwise) and its later runs until lifted."""
        return Stopped(self.stop(agent=agent, reason=reason, by=by))

    def erase(self, *, run_id: str | None = None, owner: str | None = None, by: str) -> Erased:
        """Delete the content of a run (and its sub-agent runs) or of every run of an owner at
        once, keeping a tombstone; one not finished is stopped and its attempt fenced out
        first (runtime/ops/erasure.py)."""
        return erase(
            self.s.engine,
            self.s.changes,
            self.s.leases,
            run_id=None if run_id is None else parse_id(run_id),
            owner=owner,
            by=by,
        )

    def known_agent(self, agent: str) -> str:
        """An agent a Stop may name: a valid name in the catalog (or declared in a tool
        module), or one that has runs; any other is refused (UnknownAgent), nothing stored."""
        parse_agent(agent)
        try:
            catalog_agent(self.s.settings, self.s.tools, agent)
            return agent
        except (ValueError, OSError):  # an unreadable catalog names no agent
            pass
        with self.s.engine.connect() as conn:
            if agent_has_runs(conn, agent):
                return agent
        raise UnknownAgent(
            f"no agent named {agent!r}: it is not in the catalog ({self.s.settings.agents_file}) "
            "and has no runs; check the name; nothing was stored"
        )

    def lift_stop(
        self,
        *,
        run_id: str | None = None,
        agent: str | None = None,
        by: str,
        reason: str | None = None,
    ) -> list[StopRow]:
        """Lift the Stops standing on one run or one agent, audited; later runs (and a run
        that has not reached its next step) go on. Returns the stops lifted (none stood: [])."""
        if (run_id is None) == (agent is None):
            raise BadRequest("lift the stop of exactly one run (run_id) or one agent (agent)")
        if not by.strip():
            raise BadRequest("lifting a stop needs who lifts it")
        if agent is not None:
            parse_agent(agent)
        with self.s.engine.connect() as conn:
            return lift_stops(
                conn,
                run_id=None if run_id is None else parse_id(run_id),
                agent=agent,
                by=by,
                reason=reason,
            )

    def approvals(self, run_id: str) -> list[ApprovalRow]:
        with self.s.engine.connect() as conn:
            return list_approvals(conn, parse_id(run_id))

    def decide(
        self, approval_id: str, *, approve: bool, by: str, reason: str | None = None
    ) -> ApprovalRow:
        """Decide a pending approval once; the run waiting on it continues at once."""
        approval_id = parse_id(approval_id, "approval id")
        with self.s.engine.connect() as conn:
            decided = decide_approval(conn, approval_id, approve=approve, by=by, reason=reason)
            if decided is None:
                current = get_approval(conn, approval_id)
        if decided is None:
            raise NotDecided(approval_id, current)
        request, woke = decided
        if woke is not None:
            publish_quietly(self.s.changes, self.s.publisher, request.run_id, woke)
        return request

    def raise_budget(
        self,
        run_id: str,
        *,
        tokens: int | None = None,
        usd: float | str | Decimal | None = None,
        scope: Scope | None = None,
    ) -> bool:
        """Set a run's budget to `tokens` and/or `usd` (what it may spend in all, what it spent
        so far included; the other is kept) and, when it waits on its budget, wake it at once
        (True). A bad amount is a BadRequest naming it (nothing stored); `scope` (a front
        principal's) finds only its runs (RunNotFound otherwise)."""
        return raise_run_budget(
            self.s.engine,
            self.s.changes,
            self.s.publisher,
            parse_id(run_id),
            tokens=tokens,
            usd=usd,
            scope=scope,
        )

    def set_budget(
        self,
        *,
        agent: str | None = None,
        tenant: str | None = None,
        period: str,
        tokens: int | None = None,
        usd: float | str | Decimal | None = None,
        lift: Sequence[str] = (),
    ) -> list[str]:
        """Set what one agent's (or one tenant's) runs may spend a `period` (`day`, `month`,
        UTC) and wake its runs waiting on it; returns them. An amount not given is kept; one
        named in `lift` ("tokens", "usd") is removed. The deployment's, not a caller's."""
        if (agent is None) == (tenant is None):
            raise BadRequest("a budget is one agent's (agent=) or one tenant's (tenant=)")
        scope, name = ("agent", agent) if agent is not None else ("tenant", tenant)
        assert name is not None
        return set_budget(
            self.s.engine,
            self.s.changes,
            self.s.publisher,
            scope,
            name,
            period,
            tokens=tokens,
            usd=usd,
            lift=lift,
        )


__all__ = [
    "AGENT_NAME",
    "AlreadyEnded",
    "BadRequest",
    "Client",
    "NotDecided",
    "OutputMismatch",
    "RequestConflict",
    "RunNotFound",
    "RunView",
    "Stopped",
    "UnknownAgent",
    "parse_after",
    "parse_agent",
    "parse_id",
    "resolve_run_id",
    "still_waiting",
]
