"""Making the calls of one step, and taking up on resume the calls a checkpoint left.

Every call passes the gates as they stand now, and its arguments are validated before anything
is marked or sent. A read is made directly, never marked. A changing call is marked in doubt
(fenced), made with its step key through the send guard, then its outcome recorded (fenced), so
a resume reuses it instead of settling it. A write left in doubt is settled by its kind
(`settlement.py`); only a keyed write is ever sent again. A tool that fails while no request of
its call has left the send guard (`traffic.watched`) failed for certain: the model is told its
error, the mark is recorded `failed`, the worker logs it with its traceback. Approval-held calls
and delegations may suspend the run (`waiting.py`).
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import structlog

from runtime.base import faults
from runtime.base.redact import error_facts, frames
from runtime.core.deps import AttemptDeps
from runtime.core.fence import Fence
from runtime.core.pending import PendingCall
from runtime.core.settlement import (
    NOT_FOUND_NOTE,
    UNKNOWN_NOTE,
    MarkFacts,
    decide,
    not_found_note,
    taken_up_as,
    unknown_note,
)
from runtime.core.waiting import WaitRouter
from runtime.durable.definition import RunDefinition
from runtime.durable.gates import call_refusal
from runtime.durable.keys import agent_call_key, fresh_key
from runtime.durable.state import Message, RunState, ToolCall
from runtime.fleet.heartbeat import RunLease
from runtime.sending import http, traffic
from runtime.sending.call_http import CallHTTP
from runtime.toolbox.tools import (
    CallContext,
    InvalidArguments,
    Outcome,
    Tool,
    ToolError,
    ToolFailed,
    ToolInDoubt,
    ToolKind,
)
from store.checkpoints import finish_mark, mark_in_doubt, marks_by_index, select_marks
from store.rows import GateRow, MarkRow, RunRow
from store.states import MarkStatus, Settle

log = structlog.get_logger(__name__)

Routed = tuple[Outcome, str, str]  # outcome, how it was settled, the call's kind
KeyFn = Callable[[RunState, int, ToolCall], tuple[str, bool]]
UNKNOWN: Outcome = {"outcome": "unknown", "note": UNKNOWN_NOTE}
NOT_FOUND: Outcome = {"outcome": "not_found", "note": NOT_FOUND_NOTE}
# A keyed write that fails in doubt within its attempt is sent again with the same key this
# many times in all, after these pauses, while its vendor's dedupe window lasts (I2).
KEYED_TRIES = 4
KEYED_BACKOFF_S = (0.25, 0.5, 1.0)


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


def agent_key(run: RunRow) -> KeyFn:
    """Agent tool-call keys (I8); a positional provider id gets a fresh key per call."""

    def key_for(state: RunState, index: int, call: ToolCall) -> tuple[str, bool]:
        key = agent_call_key(run.correlation_id, state.loop, state.step, call.id)
        return (key, True) if key is not None else (fresh_key(), False)

    return key_for


class CallRouter:
    """Routes the calls of the current step for one attempt of one run."""

    def __init__(
        self,
        deps: AttemptDeps,
        run: RunRow,
        definition: RunDefinition,
        lease: RunLease,
        key_for: KeyFn | None = None,
    ) -> None:
        self.d = deps
        self.run = run
        self.definition = definition
        self.lease = lease
        self.key_for = key_for or agent_key(run)
        self.fence = Fence(deps.engine, lease, deps.changes)
        self.waits = WaitRouter(deps, run, definition, self.write)
        self.log = log.bind(run_id=run.id, attempt=run.attempt)
        # Bytes the current step may still add to its record (LIYAGENT_STEP_MAX_BYTES less its
        # answer and the results kept so far), set by `route`: per thread, since a Python
        # workflow's steps route at once, each on a thread of its own (runtime/core/pyflow.py).
        self._budget = threading.local()
        # A Python workflow's own steps (runtime/core/pyflow.py), by call name: its code, not a
        # tool granted to it, so containment does not apply; every other gate does.
        self.local: dict[str, Tool] = {}

    @property
    def _left(self) -> int:
        left: int = getattr(self._budget, "left", self.d.settings.step_max_bytes)
        return left

    @_left.setter
    def _left(self, value: int) -> None:
        self._budget.left = value

    def narrow(self, definition: RunDefinition) -> None:
        """Route by `definition` from now on (the attempt's, narrowed to its pinned tools)."""
        self.definition = definition
        self.waits.definition = definition

    def route(
        self, state: RunState, resuming: bool, gates: GateRow
    ) -> tuple[list[Message], list[Settled]]:
        marks: dict[int, MarkRow] = {}
        if resuming:
            with self.d.engine.connect() as conn:
                marks = marks_by_index(select_marks(conn, self.run.id, state.step))
        results: list[Message] = []
        settled: list[Settled] = []
        self._left = self.d.settings.step_max_bytes - state.asked_bytes()  # this thread's
        tracing = self.d.tracing
        for index, call in enumerate(state.calls):
            with tracing.call(call.name, index, call.id) as span:
                outcome, how, kind = self._one(state, index, call, marks.get(index), gates)
                tracing.settled(span, kind, how)
            message = tool_message(call, self._bounded(state, call, outcome))
            self._left -= len(message["content"].encode())
            results.append(message)
            settled.append(Settled(call.id, call.name, kind, how))
        return results, settled

    def _one(
        self, state: RunState, index: int, call: ToolCall, mark: MarkRow | None, gates: GateRow
    ) -> Routed:
        local = self.local.get(call.name)
        tool = local or self.d.tools.get(call.name)
        facts = None
        if mark is not None:
            facts = MarkFacts(ToolKind(mark.kind), mark.status, mark.stable_key, mark.age_s)
        decision = decide(
            kind_now=None if tool is None else tool.kind,
            mark=facts,
            has_reader=tool is not None and tool.reader is not None,
            dedupe_window_s=None if tool is None else tool.dedupe_window_s,
            resume_bound_s=self.d.settings.timings.resume_bound_s,
        )
        kind = mark.kind if mark is not None else (tool.kind.value if tool else "unknown")
        if decision is Settle.REUSE and mark is not None:
            return self._reuse(state, mark), Settle.REUSE, kind
        refusal = None
        if local is None:
            refusal = call_refusal(gates, self.run.agent, self.definition.tools, call.name)
        if refusal is None and tool is None:
            refusal = f"tool {call.name} is not available"
        if refusal is not None:
            return self._refuse(state, index, mark, refusal), Settle.REFUSED, kind
        assert tool is not None
        if decision is Settle.MAKE:
            outcome = self._make(state, index, call, tool)
            return outcome, taken_up_as(outcome).value, kind
        assert mark is not None
        self.d.tracing.call_key(mark.idem_key)
        marked = PendingCall(state, index, call, tool, mark.idem_key, True)
        if decision is Settle.RESEND:
            outcome, how = self._send(marked, mark.age_s, sent_before=True)
            return outcome, how or Settle.RESEND, kind
        if decision is Settle.READ_BACK:
            outcome, how = self._read_back(marked)
            return outcome, how, kind
        return self._settle(state, index, Settle.UNKNOWN), Settle.UNKNOWN, kind

    def ctx(self, state: RunState, call: ToolCall, key: str, stable: bool = True) -> CallContext:
        timeout = self.d.settings.timings.call_timeout_s
        return CallContext(
            run_id=self.run.id,
            attempt=self.run.attempt,
            step=state.step,
            call_id=call.id,
            tool=call.name,
            key=key,
            stable_key=stable,
            timeout_s=timeout,
            http=CallHTTP.for_call(
                key=key,
                run_id=self.run.id,
                attempt=self.run.attempt,
                call=f"{state.step}:{call.id}",
                timeout_s=timeout,
            ),
        )

    def _make(self, state: RunState, index: int, call: ToolCall, tool: Tool) -> Outcome:
        if call.args_error is not None:  # unreadable arguments: told, not made, nothing marked
            problem = {"field": "(arguments)", "message": call.args_error}
            return self._invalid(call, InvalidArguments(call.name, [problem]))
        if tool.kind is ToolKind.DELEGATION:
            return self.waits.delegate(state, index, call, own=tool.origin == "workflow")
        try:
            tool.validate(call.args)  # refused before anything is marked or sent
        except InvalidArguments as exc:
            return self._invalid(call, exc)
        if tool.kind is ToolKind.APPROVAL_WRITE:
            return self.waits.approval(state, index, call, tool)
        key, stable = self.key_for(state, index, call)
        self.d.tracing.call_key(key)
        if tool.kind is ToolKind.READ:
            self.lease.check()
            state.count("reads")
            try:
                with traffic.watched():
                    return tool.make(call.args, self.ctx(state, call, key, stable))
            except ToolFailed as exc:
                self._log_failure(call, tool, exc, "call.failed")
                return exc.outcome()
            except ToolInDoubt as exc:  # a read is harmless to make again: just say so
                self._log_failure(call, tool, exc, "call.read_failed")
                return {"error": str(exc)}
            except ToolError as exc:
                return {"error": str(exc)}
        return self.write(PendingCall(state, index, call, tool, key, stable), settlement=None)

    def _invalid(self, call: ToolCall, exc: InvalidArguments) -> Outcome:
        """The model's arguments do not fit: it is told what is wrong and may try again."""
        self.log.info("call.invalid_arguments", call_id=call.id, tool=call.name, why=str(exc))
        return exc.outcome()

    def write(self, p: PendingCall, settlement: Settle | None) -> Outcome:
        """Mark in doubt, send with the key, record the outcome: the path of every write."""
        with self.fence.write() as conn:
            mark_in_doubt(
                conn,
                run_id=self.run.id,
                attempt=self.run.attempt,
                step=p.state.step,
                call_index=p.index,
                call_id=p.call.id,
                tool=p.tool.name,
                kind=p.tool.kind.value,
                idem_key=p.key,
                stable_key=p.stable,
            )
        faults.point("after_mark")
        p.state.count("writes")
        outcome, _ = self._send(p, 0.0, settlement, False)
        return outcome

    def _send(
        self,
        p: PendingCall,
        marked_s_ago: float,
        settlement: Settle | None = Settle.RESEND,
        sent_before: bool = True,
    ) -> tuple[Outcome, str | None]:
        """Send a marked write and record its outcome. A keyed write that fails in doubt is
        sent again with its key, a bounded number of times inside its dedupe window; any
        other doubt is settled by a reader, or reported unknown (never sent again, I2). A
        write that fails while no request of it ever left (`sent_before`: an earlier attempt
        may have sent it) is recorded failed: nothing was sent."""
        state, index, call, tool = p.state, p.index, p.call, p.tool
        marked = time.monotonic() - marked_s_ago
        ctx = self.ctx(state, call, p.key, p.stable)
        with traffic.watched(left=sent_before):
            for attempt in range(1, KEYED_TRIES + 1):
                self.lease.check()  # a stalled attempt taken over meanwhile must not send (I3)
                faults.point("before_send")  # a pause here is what the send guard is for
                doubt: ToolError | ToolInDoubt | None = None
                try:
                    outcome = tool.make(call.args, ctx)
                except ToolFailed as exc:
                    if not sent_before and attempt == 1:  # no try of this call ever sent
                        return self._failed(p, exc), Settle.FAILED
                    doubt = exc  # an earlier try may have sent it
                except ToolError as exc:
                    outcome = {"error": str(exc)}
                except ToolInDoubt as exc:
                    doubt = exc
                if doubt is not None:
                    self._log_failure(call, tool, doubt, "call.in_doubt")
                    pause = self._keyed_pause(tool, p.stable, attempt, time.monotonic() - marked)
                    if pause is not None:
                        time.sleep(pause)  # backoff before sending again with the same key
                        continue
                    return self._settle_doubt(p, str(doubt))
                faults.point("after_send")
                self._record(state, index, outcome, settlement if attempt == 1 else Settle.RESEND)
                faults.point("after_outcome")
                return outcome, settlement
        raise AssertionError("unreachable")  # pragma: no cover

    def _failed(self, p: PendingCall, exc: ToolFailed) -> Outcome:
        """A marked write that failed before any request of it left: its error is recorded
        (sealed, a resume reuses it) and the mark is `failed`, never in doubt (I2)."""
        self._log_failure(p.call, p.tool, exc, "call.failed")
        outcome = exc.outcome()
        self._finish(p.state, p.index, MarkStatus.FAILED, outcome, Settle.FAILED)
        return outcome

    def _log_failure(self, call: ToolCall, tool: Tool, exc: Exception, event: str) -> None:
        """One line per failure, with what the tool raised and its traceback, never its
        message: it may carry user text (a database error quotes the value it refused); the
        model is the one told the message."""
        cause = exc.cause if isinstance(exc, ToolFailed) else (exc.__cause__ or exc)
        level = self.log.error if event == "call.failed" else self.log.warning
        level(
            event,
            tool=tool.name,
            kind=tool.kind.value,
            call_id=call.id,
            **error_facts(cause),
            frames=frames(cause),
        )

    def _keyed_pause(self, tool: Tool, stable: bool, tries: int, age_s: float) -> float | None:
        """The pause before sending a keyed write again, or None when it may not be resent."""
        window = tool.dedupe_window_s
        if tool.kind is not ToolKind.KEYED_WRITE or not stable or window is None:
            return None
        if tries >= KEYED_TRIES:
            return None
        pause = KEYED_BACKOFF_S[min(tries, len(KEYED_BACKOFF_S)) - 1]
        if age_s + pause >= window or pause >= self.lease.send_time_left_s():
            return None
        return pause

    def _settle_doubt(self, p: PendingCall, error: str) -> tuple[Outcome, str]:
        """A write in doubt in this attempt (it failed with `error` after its request may have
        left): read it back if a reader exists, else unknown."""
        if p.tool.reader is not None:
            return self._read_back(p, error)
        return self._settle(p.state, p.index, Settle.UNKNOWN, error), Settle.UNKNOWN

    def _read_back(self, p: PendingCall, error: str | None = None) -> tuple[Outcome, str]:
        """Look a write in doubt up by its key. Found: its outcome. Not found: the model is
        told so, and it is not sent again (the vendor may still be processing it)."""
        state, index, call, tool = p.state, p.index, p.call, p.tool
        assert tool.reader is not None
        self.lease.check()  # a taken-over attempt must not ask its vendor either (I3)
        try:
            found = tool.reader(call.args, self.ctx(state, call, p.key))
        except http.SendRefused:
            raise
        except Exception as exc:  # the reader failed: the write stays unknown, never resent
            self._log_failure(call, tool, exc, "call.read_back_failed")
            return self._settle(state, index, Settle.UNKNOWN, error), Settle.UNKNOWN
        if found is None:
            return self._settle(state, index, Settle.NOT_FOUND, error), Settle.NOT_FOUND
        self._record(state, index, found, Settle.READ_BACK)
        return found, Settle.READ_BACK

    def _refuse(self, state: RunState, index: int, mark: MarkRow | None, why: str) -> Outcome:
        """A gate refuses the call now: it is not made, and the model is told why."""
        if mark is None:
            return {"refused": why}
        self._settle(state, index, Settle.REFUSED)
        return {
            "refused": why,
            "note": "An earlier attempt of this call may have reached its "
            "target before the process making it stopped; it was not sent again.",
        }

    def _settle(
        self, state: RunState, index: int, settlement: Settle, error: str | None = None
    ) -> Outcome:
        """Record, with an audit event, that a call in doubt was not sent again. `error`: it
        failed in this attempt (no process stopped), so the model is told that error, and the
        outcome is kept for a resume to tell it again."""
        outcome = dict(NOT_FOUND) if settlement == Settle.NOT_FOUND else dict(UNKNOWN)
        if error is None:
            self._finish(state, index, MarkStatus.SETTLED, None, settlement)
            return outcome
        note = not_found_note if settlement == Settle.NOT_FOUND else unknown_note
        outcome = {"outcome": outcome["outcome"], "error": error, "note": note(error)}
        self._finish(state, index, MarkStatus.SETTLED, outcome, settlement)
        return outcome

    def _reuse(self, state: RunState, mark: MarkRow) -> Outcome:
        """A recorded outcome (opened against its seal: a tampered one fails the run, I6)."""
        if mark.outcome is None:
            if mark.settlement == Settle.NOT_FOUND:
                return dict(NOT_FOUND)
            return dict(UNKNOWN)
        outcome: Outcome = self.d.sealer.open(
            self.run.id, f"outcome:{mark.call_index}", state.step, mark.outcome
        )
        return outcome

    def _bounded(self, state: RunState, call: ToolCall, outcome: Outcome) -> Outcome:
        """The outcome, or a refusal the model reads when it would take the step past
        LIYAGENT_STEP_MAX_BYTES: a result too large is never kept, whole or in part. The same
        outcome at the same place in the step is judged the same way (recorded, then routed)."""
        size = len(json.dumps(outcome, sort_keys=True, default=str).encode())
        if size <= self._left:
            return outcome
        limit = self.d.settings.step_max_bytes
        log.warning("call.result_too_large", call_id=call.id, tool=call.name, bytes=size)
        return {
            "refused": (
                f"the result of {call.name} (call {call.id}) was {size} bytes, more than the "
                f"{max(self._left, 0)} bytes step {state.step} may still add "
                f"(LIYAGENT_STEP_MAX_BYTES={limit}); it was not kept"
            ),
            "note": "The call was made. Ask for less at a time (a narrower query, one page).",
        }

    def _record(
        self, state: RunState, index: int, outcome: Outcome, settlement: Settle | None
    ) -> None:
        """A marked call's result, for a resume to reuse instead of settling it; a result larger
        than what the step has left is replaced by a refusal the model reads."""
        outcome = self._bounded(state, state.calls[index], outcome)
        self._finish(state, index, MarkStatus.DONE, outcome, settlement)

    def _finish(
        self,
        state: RunState,
        index: int,
        status: MarkStatus,
        outcome: Outcome | None,
        settlement: Settle | None,
    ) -> None:
        """Finish a mark in doubt, with what the model was told sealed (fenced)."""
        sealed = None
        if outcome is not None:
            sealed = self.d.sealer.seal(self.run.id, f"outcome:{index}", state.step, outcome)
        # After a long call: still ours? Else the call stays in doubt.
        with self.fence.write() as conn:
            finish_mark(
                conn,
                run_id=self.run.id,
                attempt=self.run.attempt,
                step=state.step,
                call_index=index,
                status=status,
                sealed_outcome=sealed,
                settlement=settlement,
            )
