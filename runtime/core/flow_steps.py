"""The steps of one attempt of a Python workflow: their identities, their journal, and making
each through the run's call router (marks, keys, settlement, the send guard).

A step's identity is its name and occurrence (`refund#1`, `refund#2`), never its position
alone. Its record holds its kind and its arguments' digest: a replay that meets the identity
with another kind or other arguments fails the run (`WorkflowDiverged`) rather than pair it
with that result. Each new step writes its sealed record (what completed since the last one,
and the steps now in flight, `open`) before anything of it is made (fenced, I3); a step
completed is recorded with the next record, so a resume makes again only reads that were in
flight, and takes up a write in flight by its kind (I2). Steps may run at once (threads,
`asyncio.gather`): records are written one at a time under the journal's lock.
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from runtime.base import faults
from runtime.core.calls import CallRouter
from runtime.core.deps import AttemptDeps
from runtime.core.waiting import Suspend
from runtime.durable.state import RunState, ToolCall
from runtime.fleet.heartbeat import RunLease
from runtime.sending import http
from runtime.toolbox.tools import Tool
from runtime.toolbox.workflow_kinds import (
    StepError,
    StepKind,
    WorkflowDiverged,
    WorkflowStopped,
    check_name,
)
from store.checkpoints import select_marks
from store.rows import GateRow, RunRow

Outcome = dict[str, Any]


class FlowAttempt(Protocol):
    """What the journal uses of its attempt (runtime/core/pyflow.py, `PyWorkflowRun`)."""

    run: RunRow
    d: AttemptDeps
    lease: RunLease
    router: CallRouter

    def write_record(self, state: RunState) -> GateRow: ...

    def current_gates(self) -> GateRow: ...

    def step_boundary(self, state: RunState, alone: bool) -> None: ...


@dataclass(frozen=True)
class Step:
    """One step as the workflow asks for it: its identity, kind, the call it makes (a local
    tool's name, or a declared tool's) and its arguments as recorded."""

    identity: str
    kind: StepKind
    call_name: str
    args: dict[str, Any]
    tool: Tool | None = None


def args_digest(identity: str, args: dict[str, Any]) -> str:
    """The digest a step's arguments are recorded by; StepError when they are not JSON."""
    try:
        text = json.dumps(args, sort_keys=True, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise StepError(
            f"step {identity}: its arguments cannot be recorded ({exc}); pass JSON values "
            "(a model's model_dump(), ids rather than objects); nothing was recorded or made"
        ) from None
    return hashlib.sha256(text.encode()).hexdigest()[:24]


def stopped(run_id: str, identity: str, stop: dict[str, Any]) -> WorkflowStopped:
    """The Stop a step's record holds (`stop`, beside its outcome), to raise."""
    return WorkflowStopped(run_id, identity, str(stop["reason"]), bool(stop.get("in_flight")))


def recorded(run_id: str, identity: str, entry: dict[str, Any]) -> Outcome:
    """A done step's outcome, as a replay returns it (a Stop recorded there: raised again)."""
    if "stop" in entry:
        raise stopped(run_id, identity, entry["stop"])
    return dict(entry["outcome"])


class Journal:
    """What one attempt knows of its workflow's steps, and the steps it has in flight."""

    def __init__(self, attempt: FlowAttempt, state: RunState) -> None:
        self.a = attempt
        self.state = state
        self.lock = threading.Condition(threading.RLock())
        self.in_flight = 0
        # The first exception of the engine's own (a wait, a fence, a hand-back, a failure) a
        # step met: raised again to every later step and when the workflow returns, so user
        # code that catches broadly cannot carry on past it.
        self.fatal: BaseException | None = None
        self._seen: dict[str, int] = {}
        self._kinds: dict[str, StepKind] = {}
        self.done: dict[str, dict[str, Any]] = {}
        self.timers: dict[str, float] = {}
        self.marks: dict[str, Any] = {}
        # A Stop to raise in the function (a workflow that catches one, stopped: its gates'
        # words, set by the attempt), and whether a step has raised it already.
        self.stopping: str | None = None
        self.stop_raised = False
        # The steps in flight when it was stopped (recorded with its first Stop): each gets
        # the Stop, never sent again; steps in flight later are its compensation's.
        self.stop_open: set[str] = set()
        for m in state.messages:
            if m.get("role") == "step":
                self.done[str(m["id"])] = m
                if "stop" in m and not self.stop_raised:
                    self.stop_raised = True
                    self.stop_open = set(m["stop"].get("open", []))
            elif m.get("role") == "timer":
                self.timers[str(m["id"])] = float(m["until"])
            elif m.get("role") == "mark":
                self.marks[str(m["id"])] = m["value"]
        # A checkpoint's calls are the step it started; the steps in flight are `open`.
        state.calls = []
        self.open: dict[str, dict[str, Any]] = state.cursor.setdefault("open", {})
        if not self.stop_raised:
            self.stop_open = set(self.open)

    # Identities.

    def identity(self, name: str, kind: StepKind, scope: str | None = None) -> str:
        """The next occurrence of `name` in this replay, within `scope` (a concurrent branch
        of an async workflow: the identity of its first step) when given; StepError when the
        name was used with another kind (one name, one kind, in one workflow)."""
        try:
            check_name(name, "step")
        except ValueError as exc:
            raise StepError(str(exc)) from None
        path = name if scope is None else f"{scope}/{name}"
        with self.lock:
            known = self._kinds.setdefault(name, kind)
            if known is not kind:
                raise StepError(
                    f"step name {name!r} is used for a {known.value} step and now for a "
                    f"{kind.value} step; give each its own name (nothing was recorded)"
                )
            n = self._seen.get(path, 0) + 1
            self._seen[path] = n
            return f"{path}#{n}"

    # Engine exceptions.

    def _raise_fatal(self) -> None:
        if self.fatal is not None:
            raise self.fatal

    def _fatal(self, exc: BaseException) -> None:
        with self.lock:
            if self.fatal is None:
                self.fatal = exc

    def _stopping(self, exc: BaseException) -> None:
        """An exception a step raised: the workflow's own to handle (`StepError`, a Stop it
        catches), or the engine's (a wait, a fence, a hand-back, a divergence), which stops
        the workflow."""
        if not isinstance(exc, StepError | WorkflowStopped):
            self._fatal(exc)

    def stop_point(self, identity: str, kind: StepKind, digest: str | None = None) -> None:
        """Where a stopped workflow that catches a Stop gets it: every step that was in flight
        when it was stopped (each a branch of its own, none sent again), and the first other
        step its replay meets that is not done (the timer or signal it waited on, or a new
        one), record the Stop beside their outcome (fenced, I3) and raise it; a replay raises
        it there again. Steps after it (the workflow's compensation) are made as usual."""
        with self.lock:
            if self.stopping is None or identity in self.done:
                return
            if self.stop_raised and identity not in self.stop_open:
                return
            entry = self._stop_entry(identity, kind.value, digest or args_digest(identity, {}))
            self.guarded(self._record)
        raise stopped(self.a.run.id, identity, entry["stop"])

    def _stop_entry(self, identity: str, kind: str, digest: str) -> dict[str, Any]:
        """Record (in the state, not yet written) the Stop as step `identity`'s end. Under
        the lock."""
        stop: dict[str, Any] = {"reason": self.stopping}
        if not self.stop_raised:
            stop["open"] = sorted(self.stop_open)
        if self.open.pop(identity, None) is not None:
            stop["in_flight"] = True
        entry = {
            "role": "step",
            "id": identity,
            "kind": kind,
            "digest": digest,
            "outcome": {},
            "stop": stop,
        }
        self.state.messages.append(entry)
        self.done[identity] = entry
        self.stop_raised = True
        return entry

    def _verify(self, identity: str, entry: dict[str, Any], kind: StepKind, digest: str) -> None:
        if entry.get("kind") != kind.value or entry.get("digest") != digest:
            raise WorkflowDiverged(
                f"run {self.a.run.id}: step {identity} is recorded as a {entry.get('kind')} "
                f"step with other arguments than the {kind.value} step the code asks for now "
                "(a step inserted or changed under the same name): it was not paired with "
                "that result; deploy code that replays the run as it ran, or start it again"
            )

    # Steps.

    def make(self, step: Step) -> Outcome:
        """The step's outcome: recorded, taken up from flight, or made now."""
        digest = args_digest(step.identity, step.args)
        try:
            with self.lock:
                self._raise_fatal()
                entry = self.done.get(step.identity)
                if entry is not None:
                    self._verify(step.identity, entry, step.kind, digest)
                    return recorded(self.a.run.id, step.identity, entry)
                self.stop_point(step.identity, step.kind, digest)
                if step.tool is not None:
                    self.a.router.local[step.call_name] = step.tool
                flying = self.open.get(step.identity)
                if flying is not None:
                    self._verify(step.identity, flying, step.kind, digest)
                    number, resuming, gates = int(flying["step"]), True, self.a.current_gates()
                else:
                    (number, gates), resuming = self._start(step, digest), False
                self.in_flight += 1
        except BaseException as exc:
            self._stopping(exc)
            raise
        try:
            view = RunState(
                step=number,
                loop=self.state.loop,
                messages=[],
                calls=[ToolCall(step.identity, step.call_name, step.args)],
                # Its own copy (a delegation adds its key), merged back under the lock: the
                # state's is sealed by other steps' records meanwhile.
                delegation_keys=dict(self.state.delegation_keys),
            )
            with http.guarded(self.a.lease):
                results, _ = self.a.router.route(view, resuming=resuming, gates=gates)
            outcome: Outcome = json.loads(results[0]["content"])
        except BaseException as exc:
            with self.lock:
                self.in_flight -= 1
                self.lock.notify_all()
            self._stopping(exc)
            raise
        with self.lock:
            self._done(step, digest, outcome, view)
        return outcome

    def _start(self, step: Step, digest: str) -> tuple[int, GateRow]:
        """Write the record that starts `step` (in flight from now on), after a step boundary;
        its number, and the gates its call goes through (read with the record). Called under
        the lock."""
        limit = self.a.d.settings.step_max_bytes
        size = len(json.dumps(step.args, sort_keys=True).encode())
        if size > limit:
            raise StepError(
                f"step {step.identity}: its arguments are {size} bytes, more than "
                f"LIYAGENT_STEP_MAX_BYTES={limit}; nothing was recorded or made: pass less "
                "(an id to look up rather than the object)"
            )
        self.a.step_boundary(self.state, alone=self.in_flight == 0)
        state = self.state
        state.step += 1
        call = ToolCall(step.identity, step.call_name, step.args)
        state.calls = [call]
        self.open[step.identity] = {
            "step": state.step,
            "kind": step.kind.value,
            "digest": digest,
            "name": step.call_name,
            "args": step.args,
        }
        gates = self.a.write_record(state)
        faults.point("after_checkpoint")
        return state.step, gates

    def _done(self, step: Step, digest: str, outcome: Outcome, view: RunState) -> None:
        entry = {
            "role": "step",
            "id": step.identity,
            "kind": step.kind.value,
            "digest": digest,
            "outcome": outcome,
        }
        self.state.messages.append(entry)
        self.done[step.identity] = entry
        self.open.pop(step.identity, None)
        self.state.delegation_keys.update(view.delegation_keys)
        for name, n in view.counters.items():
            self.state.count(name, n)
        self.state.count("executed")
        self.in_flight -= 1
        self.lock.notify_all()

    # Facts recorded once: a timer's due time, a signal taken.

    def due_at(self, identity: str, seconds: float) -> float:
        """When the timer `identity` is due: recorded the first time it is met (its record
        written), read back on every replay."""
        return float(self.guarded(lambda: self._due_at(identity, seconds)))

    def _due_at(self, identity: str, seconds: float) -> float:
        with self.lock:
            self._raise_fatal()
            entry = self.done.get(identity)
            if entry is not None:
                recorded(self.a.run.id, identity, entry)  # a Stop raised at this timer: again
            until = self.timers.get(identity)
            if until is None or until > time.time():
                self.stop_point(identity, StepKind.SLEEP)
            if until is None:
                until = time.time() + seconds
                self.a.step_boundary(self.state, alone=self.in_flight == 0)
                self.state.messages.append({"role": "timer", "id": identity, "until": until})
                self.timers[identity] = until
                self._record()
            return until

    def mark(self, identity: str, read: Callable[[], Any]) -> Any:
        """A fact step `identity` reads once, the first time it is met (`read`, recorded with
        a record of its own before it is used), and finds again on every replay: where an
        event wait starts."""
        return self.guarded(lambda: self._mark(identity, read))

    def _mark(self, identity: str, read: Callable[[], Any]) -> Any:
        with self.lock:
            self._raise_fatal()
            if identity not in self.marks:
                value = read()
                self.a.step_boundary(self.state, alone=self.in_flight == 0)
                self.state.messages.append({"role": "mark", "id": identity, "value": value})
                self.marks[identity] = value
                self._record()
            return self.marks[identity]

    def settle(self, identity: str, kind: StepKind, value: Any) -> Any:
        """Record a step with no call (a signal taken, a wait timed out) as done."""
        self.guarded(lambda: self._settle(identity, kind, value))
        return value

    def _settle(self, identity: str, kind: StepKind, value: Any) -> None:
        with self.lock:
            entry = {
                "role": "step",
                "id": identity,
                "kind": kind.value,
                "digest": args_digest(identity, {}),
                "outcome": {"value": value},
            }
            self.state.messages.append(entry)
            self.done[identity] = entry
            self._record()

    def recorded(self, identity: str, kind: StepKind) -> Outcome | None:
        """The outcome recorded for a step with no call of its own, or None."""
        found: Outcome | None = self.guarded(lambda: self._recorded(identity, kind))
        return found

    def _recorded(self, identity: str, kind: StepKind) -> Outcome | None:
        with self.lock:
            self._raise_fatal()
            entry = self.done.get(identity)
            if entry is None:
                return None
            self._verify(identity, entry, kind, args_digest(identity, {}))
            return recorded(self.a.run.id, identity, entry)

    def wait(self, waiting_on: str) -> None:
        """Raise the wait (`Suspend`) for the whole workflow."""
        exc = Suspend(waiting_on)
        self._fatal(exc)
        raise exc

    def guarded(self, fn: Callable[[], Any]) -> Any:
        """Run `fn` (a store statement of a step) so that an engine exception it raises stops
        the workflow."""
        try:
            return fn()
        except BaseException as exc:
            self._stopping(exc)
            raise

    def _record(self) -> None:
        """Write a record of what completed (no call of its own). Under the lock."""
        self.state.step += 1
        self.state.calls = []
        self.a.write_record(self.state)

    # The workflow's end.

    def quiesce(self) -> None:
        """Wait for the steps still in flight (another thread's, a gather's) to end."""
        with self.lock:
            while self.in_flight:
                self.lock.wait(1.0)

    def unrecorded(self) -> bool:
        written = self.state.written
        return written is None or written.messages < len(self.state.messages)

    def record_before_wait(self) -> None:
        """Before the run waits: a record of the steps completed since the last one."""
        with self.lock:
            if self.unrecorded():
                self._record()

    def settle_unmet(self) -> None:
        """Steps in flight when an earlier attempt stopped that this replay never met (the
        code changed), at the end: one whose call was marked is taken up from its mark (its
        outcome reused; a declared tool's write read back or sent again with its key by its
        kind; a function step's, whose function this code no longer has, settled as not sent
        again, I2); one never marked was never sent, and is not made now, nor an approval filed
        or a child started for it."""
        for identity, flying in sorted(self.open.items()):
            if self.stopping is not None and identity in self.stop_open:
                with self.lock:  # in flight when it was stopped: never sent again
                    self._stop_entry(identity, str(flying["kind"]), str(flying["digest"]))
                continue
            number = int(flying["step"])
            with self.a.d.engine.connect() as conn:
                marked = select_marks(conn, self.a.run.id, number)
            if marked:
                kind = StepKind(flying["kind"])
                self.make(Step(identity, kind, str(flying["name"]), dict(flying["args"])))
                continue
            outcome = {"refused": f"step {identity} is no longer asked for: it was not made"}
            with self.lock:
                self.state.messages.append(
                    {"role": "step", "id": identity, "kind": flying["kind"],
                     "digest": flying["digest"], "outcome": outcome}
                )  # fmt: skip
                self.open.pop(identity, None)
