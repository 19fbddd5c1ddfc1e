"""Making the calls of one step, and taking up on resume the calls a checkpoint left.

A read is made directly, never marked. A changing call is marked in doubt (fenced), made with
its step key, then its outcome recorded (fenced), so a resume reuses it instead of settling it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import structlog

from runtime import faults
from runtime.heartbeat import RunLease
from runtime.keys import agent_call_key, fresh_key
from runtime.services import Services
from runtime.settlement import UNKNOWN_NOTE, MarkFacts, Settle, decide
from runtime.state import Message, RunState, ToolCall
from runtime.tools import CallContext, Tool, ToolError, ToolInDoubt, ToolKind
from store.checkpoints import (
    mark_in_doubt,
    marks_by_index,
    record_outcome,
    select_marks,
    settle_unknown,
)
from store.rows import MarkRow, RunRow

log = structlog.get_logger(__name__)

Outcome = dict[str, Any]
UNKNOWN: Outcome = {"outcome": "unknown", "note": UNKNOWN_NOTE}


@dataclass(frozen=True)
class Settled:
    """How one call of a step was taken up, for the resume's audit."""

    call_id: str
    tool: str
    kind: str
    settled: str

    def to_json(self) -> dict[str, str]:
        return {
            "call_id": self.call_id,
            "tool": self.tool,
            "kind": self.kind,
            "settled": self.settled,
        }


def tool_message(call: ToolCall, outcome: Outcome) -> Message:
    return {
        "role": "tool",
        "tool_call_id": call.id,
        "name": call.name,
        "content": json.dumps(outcome, sort_keys=True, default=str),
    }


class CallRouter:
    """Routes the calls of the current step for one attempt of one run."""

    def __init__(self, services: Services, run: RunRow, lease: RunLease) -> None:
        self.s = services
        self.run = run
        self.lease = lease

    def route(self, state: RunState, resuming: bool) -> tuple[list[Message], list[Settled]]:
        marks: dict[int, MarkRow] = {}
        if resuming:
            with self.s.engine.connect() as conn:
                marks = marks_by_index(select_marks(conn, self.run.id, state.step))
        results: list[Message] = []
        settled: list[Settled] = []
        for index, call in enumerate(state.calls):
            outcome, how, kind = self._one(state, index, call, marks.get(index))
            results.append(tool_message(call, outcome))
            settled.append(Settled(call.id, call.name, kind, how))
        return results, settled

    def _one(
        self, state: RunState, index: int, call: ToolCall, mark: MarkRow | None
    ) -> tuple[Outcome, str, str]:
        tool = self.s.tools.get(call.name)
        facts = None
        if mark is not None:
            facts = MarkFacts(ToolKind(mark.kind), mark.status, mark.stable_key, mark.age_s)
        decision = decide(
            kind_now=None if tool is None else tool.kind,
            mark=facts,
            has_reader=tool is not None and tool.reader is not None,
            dedupe_window_s=None if tool is None else tool.dedupe_window_s,
            resume_bound_s=self.s.settings.timings.resume_bound_s,
        )
        kind = mark.kind if mark is not None else (tool.kind.value if tool else "unknown")
        if decision is Settle.REUSE and mark is not None:
            return self._reuse(state, mark), Settle.REUSE.value, kind
        if tool is None:
            if mark is not None:
                return self._unknown(state, index), Settle.UNKNOWN.value, kind
            return {"error": f"tool {call.name!r} is not available"}, "refused", kind
        if decision is Settle.MAKE:
            return self._make(state, index, call, tool), Settle.MAKE.value, kind
        assert mark is not None
        if decision is Settle.RESEND:
            outcome = self._write(
                state,
                index,
                call,
                tool,
                mark.idem_key,
                mark.stable_key,
                settlement=Settle.RESEND.value,
            )
            return outcome, Settle.RESEND.value, kind
        if decision is Settle.READ_BACK:
            return self._read_back(state, index, call, tool, mark)
        return self._unknown(state, index), Settle.UNKNOWN.value, kind

    def _ctx(self, state: RunState, call: ToolCall, key: str) -> CallContext:
        return CallContext(
            run_id=self.run.id,
            attempt=self.run.attempt,
            step=state.step,
            call_id=call.id,
            key=key,
            timeout_s=self.s.settings.timings.call_timeout_s,
        )

    def _key(self, state: RunState, call: ToolCall) -> tuple[str, bool]:
        key = agent_call_key(self.run.correlation_id, state.loop, state.step, call.id)
        return (key, True) if key is not None else (fresh_key(), False)

    def _make(self, state: RunState, index: int, call: ToolCall, tool: Tool) -> Outcome:
        key, stable = self._key(state, call)
        if tool.kind is ToolKind.READ:
            self.lease.ensure()
            state.count("reads")
            try:
                return tool.invoke(call.args, self._ctx(state, call, key))
            except (ToolError, ToolInDoubt) as exc:
                return {"error": str(exc)}
        return self._write(state, index, call, tool, key, stable, settlement=None)

    def _write(
        self,
        state: RunState,
        index: int,
        call: ToolCall,
        tool: Tool,
        key: str,
        stable: bool,
        settlement: str | None,
    ) -> Outcome:
        self.lease.ensure()
        with self.s.engine.connect() as conn:
            mark_in_doubt(
                conn,
                run_id=self.run.id,
                attempt=self.run.attempt,
                step=state.step,
                call_index=index,
                call_id=call.id,
                tool=tool.name,
                kind=tool.kind.value,
                idem_key=key,
                stable_key=stable,
            )
        faults.point("after_mark")
        self.lease.ensure()  # a stalled attempt taken over meanwhile must not send (I3)
        state.count("writes")
        try:
            outcome = tool.invoke(call.args, self._ctx(state, call, key))
        except ToolError as exc:
            outcome = {"error": str(exc)}
        except ToolInDoubt as exc:
            log.warning(
                "call.in_doubt",
                run_id=self.run.id,
                step=state.step,
                call_id=call.id,
                error=str(exc),
            )
            return self._settle_live_doubt(state, index, call, tool, key)
        faults.point("after_send")
        self._record(state, index, outcome, settlement)
        faults.point("after_outcome")
        return outcome

    def _settle_live_doubt(
        self, state: RunState, index: int, call: ToolCall, tool: Tool, key: str
    ) -> Outcome:
        """A write that timed out in this attempt: look it up if a reader exists, else unknown."""
        if tool.reader is not None:
            try:
                found = tool.reader(call.args, self._ctx(state, call, key))
            except (ToolError, ToolInDoubt):
                found = None
            if found is not None:
                self._record(state, index, found, Settle.READ_BACK.value)
                return found
        return self._unknown(state, index)

    def _read_back(
        self, state: RunState, index: int, call: ToolCall, tool: Tool, mark: MarkRow
    ) -> tuple[Outcome, str, str]:
        assert tool.reader is not None
        self.lease.ensure()
        try:
            found = tool.reader(call.args, self._ctx(state, call, mark.idem_key))
        except (ToolError, ToolInDoubt) as exc:
            log.warning("call.read_back_failed", run_id=self.run.id, error=str(exc))
            return self._unknown(state, index), Settle.UNKNOWN.value, mark.kind
        if found is not None:
            self._record(state, index, found, Settle.READ_BACK.value)
            return found, Settle.READ_BACK.value, mark.kind
        # The reader proves the write never landed: send it now, under the same key.
        outcome = self._write(
            state,
            index,
            call,
            tool,
            mark.idem_key,
            mark.stable_key,
            settlement="sent_after_read_back",
        )
        return outcome, "sent_after_read_back", mark.kind

    def _unknown(self, state: RunState, index: int) -> Outcome:
        with self.s.engine.connect() as conn:
            settle_unknown(
                conn,
                run_id=self.run.id,
                attempt=self.run.attempt,
                step=state.step,
                call_index=index,
            )
        return dict(UNKNOWN)

    def _reuse(self, state: RunState, mark: MarkRow) -> Outcome:
        if mark.outcome is None:
            return dict(UNKNOWN)
        outcome: Outcome = self.s.sealer.open(
            self.run.id, f"outcome:{mark.call_index}", state.step, mark.outcome
        )
        return outcome

    def _record(
        self, state: RunState, index: int, outcome: Outcome, settlement: str | None
    ) -> None:
        sealed = self.s.sealer.seal(self.run.id, f"outcome:{index}", state.step, outcome)
        with self.s.engine.connect() as conn:
            record_outcome(
                conn,
                run_id=self.run.id,
                attempt=self.run.attempt,
                step=state.step,
                call_index=index,
                sealed_outcome=sealed,
                settlement=settlement,
            )
