"""Calls that may make a run wait: approval-held writes and delegations to sub-agents.

A run that may wait suspends (status waiting; its task ends; no worker or lease is held) and
is queued again by whatever it waited for. Routing the same call again after a crash files no
second approval (one request per step key) and creates no second child (one per delegation
key): it finds the first, and its outcome if it has one.
"""

from __future__ import annotations

import json
import uuid
from typing import Any, Protocol

from runtime.base import faults
from runtime.core import catalog
from runtime.core.deps import AttemptDeps
from runtime.core.enqueue import BadRequest, NewRun, enqueue, publish_quietly
from runtime.core.pending import PendingCall
from runtime.durable.definition import RunDefinition
from runtime.durable.keys import approval_step_key, delegation_key
from runtime.durable.state import RunState, ToolCall
from runtime.fleet import usage_notes
from runtime.toolbox.tools import AgentDef, Tool
from store.entries import EntryKind
from store.losses import claim_lost
from store.rows import RunRow
from store.runs import get_run_by_request_key
from store.states import OWNED, ApprovalStatus, RunStatus, Seen, Settle
from store.waits import ensure_approval

Outcome = dict[str, Any]


class SendWrite(Protocol):
    """The write path of the router that owns this wait router: mark, send, record."""

    def __call__(self, p: PendingCall, settlement: Settle | None) -> Outcome: ...


class Suspend(Exception):
    """The run waits for `waiting_on` (approval:<id>, child:<run id>, timer:<at> or
    model:<profile>:<until>:<reason>); `detail` is added to its `agent.run.waiting` event."""

    def __init__(self, waiting_on: str, detail: dict[str, Any] | None = None) -> None:
        super().__init__(waiting_on)
        self.waiting_on = waiting_on
        self.detail = detail or {}


class WaitRouter:
    def __init__(
        self, deps: AttemptDeps, run: RunRow, definition: RunDefinition, write: SendWrite
    ) -> None:
        self.d = deps
        self.run = run
        self.definition = definition
        self.write = write

    @property
    def may_wait(self) -> bool:
        return self.definition.may_wait

    def approval(self, state: RunState, index: int, call: ToolCall, tool: Tool) -> Outcome:
        """File (or find) the request; wait, report a refusal, or send with the approval id."""
        step_key = approval_step_key(
            self.run.correlation_id, state.loop, state.step, index, call.id
        )
        with self.d.engine.connect() as conn:
            request = ensure_approval(
                conn,
                run_id=self.run.id,
                attempt=self.run.attempt,
                approval_id=str(uuid.uuid4()),
                step=state.step,
                call_index=index,
                step_key=step_key,
                tool=tool.name,
                args=call.args,
            )
        if request.status == ApprovalStatus.DENIED:
            return {
                "denied": True,
                "approval_id": request.id,
                "by": request.decided_by,
                "reason": request.reason,
            }
        if request.status == ApprovalStatus.APPROVED:
            # An approved call always sends the approval id as its key, however often.
            return self.write(PendingCall(state, index, call, tool, request.id, True), None)
        faults.point("after_request")
        if self.may_wait:
            raise Suspend(f"approval:{request.id}")
        return {
            "held_for_approval": request.id,
            "note": "Not made: it waits for a person's approval; this run cannot wait.",
        }

    def delegate(self, state: RunState, index: int, call: ToolCall, own: bool = False) -> Outcome:
        """Ask the child by its delegation key: its answer, or wait for it (taking over its
        lapsed lease once, racing the sweeper with the same conditional claim)."""
        key = state.delegation_keys.setdefault(
            call.id, delegation_key(self.run.correlation_id, state.loop, state.step, index, call.id)
        )
        with self.d.engine.connect() as conn:
            child = get_run_by_request_key(conn, key, self.run.principal)
        if child is None:
            try:
                child_id, _ = enqueue(self.d.door, self._child(call, key, own))
            except BadRequest as exc:
                return {"error": f"the sub-agent could not be started: {exc}"}
            faults.point("after_request")
            raise Suspend(f"child:{child_id}")
        if child.status == RunStatus.SUCCEEDED and child.answer is not None:
            answer = self.d.sealer.open(child.id, "answer", 0, child.answer)
            return {"child_run": child.id, "answer": answer["text"]}
        if child.status == RunStatus.FAILED:
            return {"child_run": child.id, "error": child.failure_reason}
        if child.status in OWNED and self.d.leases.holder(child.id) is None:
            # The same claim as the sweeper's, so of the two one wins (I4); its audit names this
            # path, so an operator (and a test) can tell who took the child over.
            lost = [(child.id, child.attempt)]
            notes = usage_notes.read(self.d.redis, self.d.settings.namespace, lost)
            with self.d.engine.connect() as conn:
                claim = claim_lost(
                    conn,
                    child.id,
                    child.attempt,
                    self.d.settings.timings.loss_limit,
                    seen=Seen.PARENT_ASKED_AGAIN,
                    ask_yields=self.d.settings.resumed_first,
                    notes=notes,
                )
            if claim is not None and claim.status != RunStatus.FAILED:
                publish_quietly(self.d.changes, self.d.publisher, claim.run_id, claim.attempt)
        raise Suspend(f"child:{child.id}")

    def _child_tools(self, asked: Any) -> list[str]:
        """The tools a sub-agent may use: those asked for, each one its parent may use (a
        delegation never widens what a run can do); none when none are asked for."""
        if asked is None:
            return []
        if not isinstance(asked, list) or not all(isinstance(t, str) for t in asked):
            raise BadRequest('a delegation\'s "tools" is a list of tool names')
        parent = set(self.definition.tools)
        beyond = sorted(set(asked) - parent)
        if beyond:
            raise BadRequest(
                f"a sub-agent may use only tools its parent run may use; not {', '.join(beyond)}"
            )
        return list(asked)

    def _as_child(self, key: str) -> dict[str, Any]:
        """What every child run takes of its parent: who it is, where it came from, its key,
        that it may wait, and its parent's share of the fleet and turn (counted in flight,
        never held)."""
        r = self.run
        return {
            "owner": r.owner,
            "principal": r.principal,
            "entry_kind": EntryKind.DELEGATION,
            "channel": r.channel,
            "run_as": r.run_as,
            "request_key": key,
            "parent_run_id": r.id,
            "parent_attempt": r.attempt,
            "may_wait": True,
            "tenant": r.tenant,
            "priority": r.priority,
        }

    def _child(self, call: ToolCall, key: str, own: bool) -> NewRun:
        """The child run a delegation starts. `own`: a Python workflow's own step (its code
        chose the agent, its model or a child workflow); a model's delegation (arguments it
        wrote) gets its parent's model or a script, and never a workflow."""
        args = call.args
        if own and "workflow" in args:
            return self._child_workflow(args, key)
        agent, text = args.get("agent"), args.get("input")
        if not isinstance(agent, str) or not isinstance(text, str):
            raise BadRequest('a delegation needs "agent" and "input" text')
        model, system, tools = self._child_agent(agent, args, own)
        return NewRun(
            agent=agent,
            user_input=text,
            model=model,
            system=system,
            tools=self._child_tools(tools),
            **self._as_child(key),
        )

    def _child_agent(
        self, agent: str, args: dict[str, Any], own: bool
    ) -> tuple[dict[str, Any], str | None, Any]:
        """The child's model, system prompt and tools asked for. A script given: scripted. A
        workflow's agent step: the model it names (checked against the deployment's profiles
        at enqueue), else the declared agent's own model, prompt and tools. A model's
        delegation: its parent's model."""
        script, asked, tools = args.get("script"), args.get("model"), args.get("tools")
        if script is not None:
            return {"provider": "scripted", "script": script}, None, tools
        if not own:
            return dict(self.definition.model), None, tools
        if isinstance(asked, dict):
            return dict(asked), None, tools
        try:
            found = catalog.load(self.d.settings.agents_file).with_agents(self.d.tools.agents)
            declared: AgentDef | None = found.agents.get(agent)
        except catalog.CatalogError:
            declared = None
        if declared is None:
            raise BadRequest(
                f"agent {agent!r} is not declared here: name a declared agent (its model, "
                "tools and system prompt) or give model="
            )
        return dict(declared.model), declared.system, declared.tools if tools is None else tools

    def _child_workflow(self, args: dict[str, Any], key: str) -> NewRun:
        """A Python workflow's child workflow: the tools it declares must all be its parent's
        (a child never widens what a run can do)."""
        name, params = args.get("workflow"), args.get("params") or {}
        kind = self.d.tools.workflows.get(str(name))
        if kind is None or not isinstance(params, dict):
            raise BadRequest(
                f"no workflow {name!r} is declared here (or its params are not an object)"
            )
        self._child_tools(list(kind.tools))
        return NewRun(
            agent=kind.name,
            user_input=f"{kind.name} {json.dumps(params, sort_keys=True)}"[:2000],
            workflow={"python": kind.name, "params": params},
            tools=list(kind.tools),
            **self._as_child(key),
        )
