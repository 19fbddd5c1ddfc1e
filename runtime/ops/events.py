"""A run's events: every transition a person watches, derived from the rows Postgres already
holds (store/events.py reads them in one statement), each with a per-run sequence number.

**What is derived.** `queued` (the run's row), `claimed` (the run's claim, or the records of an
attempt that ran), `resumed` (a resume's audit), `step_written` (a step record), `call_marked`,
`call_made` and `call_settled` (a call's mark), `waiting` (a suspend's audit),
`approval_decided` (the approval a run waited on, once it woke), `rate_limited` and
`endpoint_wait` (a 429 its model step met, a wait in place on its endpoint: their audit),
`definition_drift` (a worker's code did not serve its pinned definition: its audit),
`handed_back`, `lost` (the claims' audit), `error`, `answered` and `delivered` (the run's
row), `failed` (its audit). Only what Postgres holds is an event: a model step being asked
writes nothing (the step budget), so it is seen when its answer is written (`step_written`);
a read call is never marked, so it shows only in a resume's `calls`. Records retention or
erasure deletes take their events with them.

**How the sequence is kept.** Events are ordered by a key built from counters and fields the
engine writes once: the *epoch* (the run's `attempt`, bumped by every claim of a lost run,
hand-back and wake, I3/I4), then a phase within it (0: the transition that opened the epoch,
written by the statement that bumped the attempt; 1: the epoch's claim; 2: what its owner
wrote; 3: the run's end), then the database's time, then the kind. `seq` is the event's rank
(1, 2, ...). It is stable and append-only because of the fence: every record of attempt n
commits before the statement opening attempt n+1 (a fenced write share-locks the run's row,
the opening statement updates it, and nothing of attempt n passes the fence after it), and
within an epoch only its owner writes, one statement after another, so each record's time is
later than every record before it. A run's end (`failed`, `delivered`) is last whatever its
time: a Stop that waited on a suspend's lock may carry an earlier time than the suspend.
Nothing is ordered by time across writers, so a concurrent insert with an older timestamp
cannot land before an event already seen.

**How a reader follows without a connection per stream.** `read_events(engine, run_id,
after=seq)` borrows a pooled connection for one statement and returns the events after `seq`
(a Last-Event-ID is such a `seq`); a follower registers a `Watch` on its process's
`RunChanges` (runtime/base/changes.py: one Redis subscription per process, fanning out), reads,
and between reads waits on the watch, woken by the engine's "run X changed" nudge or, if a
nudge is lost, by its bounded re-check interval. No connection is held while it waits: 500
streams on one front cost one subscription and a pooled read per wake-up.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field, replace
from datetime import datetime
from enum import StrEnum
from typing import Any

import sqlalchemy as sa

from runtime.base.changes import RunChanges, Watch
from runtime.core.enqueue import BadRequest
from runtime.core.model_gate import RATE_LIMITED_EVENT, WAIT_EVENT
from runtime.flow.waiting import WORDS, words
from store.events import AuditFact, RunFacts, select_run_facts
from store.states import FINISHED

# What a `definition_drift` event says (runtime/core/drift.py's audit).
DRIFT_WORDS = ("pin", "changes", "policy", "repinned", "served", "waited_s")
# How long a follower waits for a nudge before it reads again anyway: a lost nudge only delays.
RECHECK_S = 1.0


class EventKind(StrEnum):
    """What happened to a run, in the words a person watching it uses."""

    QUEUED = "queued"  # the run was stored and its message published
    CLAIMED = "claimed"  # a worker process claimed an attempt of it
    RESUMED = "resumed"  # an attempt took it up again (after a loss, a hand-back or a wait)
    STEP_WRITTEN = "step_written"  # a model step's answer was written (sealed, before its calls)
    CALL_MARKED = "call_marked"  # a call that changes something was marked just before it left
    CALL_MADE = "call_made"  # its outcome was recorded
    CALL_SETTLED = "call_settled"  # it was settled without its outcome (details: settlement)
    RATE_LIMITED = "rate_limited"  # its model endpoint answered 429 (details: Retry-After)
    ENDPOINT_WAIT = "endpoint_wait"  # its step waits in place for its endpoint (closed, limited)
    DEFINITION_DRIFT = "definition_drift"  # a worker's code did not serve its pinned definition
    WAITING = "waiting"  # the run waits (an approval, a child, a timer, an endpoint); no worker
    APPROVAL_DECIDED = "approval_decided"  # the approval it waited on was decided; it woke
    HANDED_BACK = "handed_back"  # its worker gave it back (warm shutdown, or a store fault)
    LOST = "lost"  # its worker died or stalled; the run was claimed back
    ERROR = "error"  # its attempt stopped on an unexpected error (it is then resumed)
    ANSWERED = "answered"  # its final answer was stored
    DELIVERED = "delivered"  # its answer was handed on to its entry points: it succeeded
    FAILED = "failed"  # it failed, with its reason


@dataclass(frozen=True)
class RunEvent:
    """One event of a run. `attempt` is the attempt it is about (for `lost` and `handed_back`,
    the attempt that ended); `step` the model step it concerns, when it concerns one."""

    run_id: str
    seq: int
    kind: EventKind
    at: datetime
    attempt: int
    step: int | None = None
    details: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        """The event as JSON-ready values (what the API, the CLI's --json and SSE send)."""
        return {
            "run_id": self.run_id,
            "seq": self.seq,
            "kind": self.kind.value,
            "at": self.at.isoformat(),
            "attempt": self.attempt,
            "step": self.step,
            "details": self.details,
        }


@dataclass(frozen=True)
class EventPage:
    """The events after a sequence number, and where the run stands at the same moment: once
    `done`, no event will follow the last one."""

    run_id: str
    after: int
    events: tuple[RunEvent, ...]
    status: str
    # The highest seq the run has now (`after` when there is none after it).
    last_seq: int

    @property
    def done(self) -> bool:
        return self.status in FINISHED

    def passed(self) -> EventPage:
        """This page with its events taken as given: a follower that starts from it sends only
        what is recorded after its last seq (an A2A stream's task snapshot stands for them)."""
        return replace(self, after=self.last_seq, events=())


# Phases within an epoch (see the module's docstring).
OPENING, CLAIM, OWNER, END = 0, 1, 2, 3
# Within one statement (one time), the order a person reads them in.
_RANK = {kind: rank for rank, kind in enumerate(EventKind)}


@dataclass(frozen=True)
class _Draft:
    epoch: int
    phase: int
    at: datetime
    kind: EventKind
    attempt: int
    step: int | None
    details: dict[str, Any]
    tie: tuple[int, int, int] = (0, 0, 0)

    def key(self) -> tuple[int, int, datetime, int, tuple[int, int, int]]:
        return (self.epoch, self.phase, self.at, _RANK[self.kind], self.tie)


def derive(facts: RunFacts) -> list[RunEvent]:
    """Every event of the run, in order, numbered from 1: a pure function of its facts."""
    drafts = [_queued(facts), *_from_audit(facts.audit), *_from_steps(facts), *_from_marks(facts)]
    drafts += _decided(facts, drafts)
    drafts += _answer(facts)
    drafts += _claims(facts, drafts)
    drafts.sort(key=_Draft.key)
    return [
        RunEvent(facts.run_id, seq, d.kind, d.at, d.attempt, d.step, d.details)
        for seq, d in enumerate(drafts, start=1)
    ]


def _queued(facts: RunFacts) -> _Draft:
    return _Draft(1, OPENING, facts.run.created_at, EventKind.QUEUED, 1, None, {})


def _instant(value: Any) -> datetime | None:
    return datetime.fromisoformat(value) if isinstance(value, str) and value else None


def _from_audit(audit: tuple[AuditFact, ...]) -> list[_Draft]:
    """Losses, hand-backs, resumes, waits, errors and failures, from their audit rows."""
    out: list[_Draft] = []
    for a in audit:
        epoch, d, tie = a.attempt or 1, a.detail, (0, 0, a.id)
        if "lost_attempt" in d:  # a loss's claim (requeued, or failed at the limit)
            details = {
                "seen": d.get("seen"),
                "worker": d.get("lost_holder"),
                "lost_count": d.get("lost_count"),
                "new_attempt": epoch,
            }
            lost = int(d["lost_attempt"])
            out.append(_Draft(epoch, OPENING, a.at, EventKind.LOST, lost, a.step, details, tie))
        elif "faulted_attempt" in d:  # given back after a store fault (no loss charged)
            details = {"reason": "store_fault", "worker": d.get("holder"), "new_attempt": epoch}
            faulted = int(d["faulted_attempt"])
            kind = EventKind.HANDED_BACK
            out.append(_Draft(epoch, OPENING, a.at, kind, faulted, a.step, details, tie))
        elif a.kind == "agent.run.handed_back":
            # A warm shutdown's hand-back, or a yield to a lost run (resumed runs first).
            yielded = d.get("reason") == "yielded"
            details = {
                "reason": "yielded" if yielded else "shutdown",
                "worker": d.get("worker"),
                "new_attempt": epoch,
                **({"yielded_to": d.get("yielded_to")} if yielded else {}),
            }
            kind = EventKind.HANDED_BACK
            out.append(_Draft(epoch, OPENING, a.at, kind, epoch - 1, a.step, details, tie))
        if a.kind == "agent.run.failed":
            details = {"code": d.get("code"), "reason": d.get("reason") or d.get("failure")}
            out.append(_Draft(epoch, END, a.at, EventKind.FAILED, epoch, a.step, details, tie))
        elif a.kind in ("agent.run.crash_resumed", "agent.run.resumed"):
            details = {
                "reason": d.get("reason"),
                "worker": d.get("worker"),
                "lost_count": d.get("lost_count"),
                "resumed_from": d.get("resumed_from"),
                "calls": d.get("calls") or [],
            }
            kind = EventKind.RESUMED
            out.append(_Draft(epoch, OWNER, a.at, kind, epoch, a.step, details, tie))
        elif a.kind == "agent.run.waiting":
            # A model wait says what for, in the words of a wait in place (flow/waiting.py).
            details = {"waiting_on": d.get("waiting_on"), **words(d.get("waiting_on"), d)}
            kind = EventKind.WAITING
            out.append(_Draft(epoch, OWNER, a.at, kind, epoch, a.step, details, tie))
        elif a.kind == WAIT_EVENT:
            details = {k: d.get(k) for k in WORDS}
            kind = EventKind.ENDPOINT_WAIT
            out.append(_Draft(epoch, OWNER, a.at, kind, epoch, a.step, details, tie))
        elif a.kind == RATE_LIMITED_EVENT:
            details = {k: d.get(k) for k in ("endpoint", "retry_after_s", "closed_ms")}
            kind = EventKind.RATE_LIMITED
            out.append(_Draft(epoch, OWNER, a.at, kind, epoch, a.step, details, tie))
        elif a.kind == "agent.run.definition_drift":
            details = {
                k: d[k] for k in ("pin", "changes", "policy", "repinned", "served") if k in d
            }
            kind = EventKind.DEFINITION_DRIFT
            out.append(_Draft(epoch, OWNER, a.at, kind, epoch, a.step, details, tie))
        elif a.kind == "agent.run.error":
            details = {"error": d.get("error") or d.get("type"), "worker": d.get("worker")}
            out.append(_Draft(epoch, OWNER, a.at, EventKind.ERROR, epoch, a.step, details, tie))
    return out


def _used(usage: dict[str, Any]) -> dict[str, Any]:
    """A step's or answer's details: its usage as written with it (tokens, model, cost), none
    when its provider reported none."""
    return {"usage": usage} if usage else {}


def _from_steps(facts: RunFacts) -> list[_Draft]:
    return [
        _Draft(s.attempt, OWNER, s.at, EventKind.STEP_WRITTEN, s.attempt, s.step, _used(s.usage))
        for s in facts.steps
    ]


def _from_marks(facts: RunFacts) -> list[_Draft]:
    """A mark's first marking (its first attempt and time, never moved by a re-mark), and its
    finish (done, settled or failed: written once, by the attempt that finished it)."""
    out: list[_Draft] = []
    for m in facts.marks:
        call = {"call_index": m.call_index, "call_id": m.call_id, "tool": m.tool, "kind": m.kind}
        tie = (m.step, m.call_index, 0)
        out.append(
            _Draft(
                m.first_attempt,
                OWNER,
                m.first_marked_at,
                EventKind.CALL_MARKED,
                m.first_attempt,
                m.step,
                call,
                tie,
            )
        )
        if m.status == "in_doubt" or m.settled_at is None:
            continue
        made = m.status == "done" and m.settlement is None
        kind = EventKind.CALL_MADE if made else EventKind.CALL_SETTLED
        details = {**call, "settlement": m.settlement or ("made" if made else m.status)}
        out.append(_Draft(m.attempt, OWNER, m.settled_at, kind, m.attempt, m.step, details, tie))
    return out


def _decided(facts: RunFacts, drafts: list[_Draft]) -> list[_Draft]:
    """An approval the run waited on, decided: it opens the epoch its wake began, so it shows
    once the run woke (a decision made while the run still ran shows when the wake comes)."""
    out: list[_Draft] = []
    waits = {d.details.get("waiting_on"): d.epoch for d in drafts if d.kind == EventKind.WAITING}
    for a in facts.approvals:
        epoch = waits.get(f"approval:{a.id}")
        if epoch is None or a.decided_at is None or facts.run.attempt <= epoch:
            continue
        details = {"approval_id": a.id, "tool": a.tool, "status": a.status, "by": a.decided_by}
        kind = EventKind.APPROVAL_DECIDED
        out.append(_Draft(epoch + 1, OPENING, a.decided_at, kind, epoch + 1, a.step, details))
    return out


def _ended(a: AuditFact) -> int | None:
    """The attempt an epoch-opening transition ended (a loss, a store fault), if it is one."""
    n = a.detail.get("lost_attempt", a.detail.get("faulted_attempt"))
    return None if n is None else int(n)


def _answer(facts: RunFacts) -> list[_Draft]:
    """The answer stored, in the epoch that stored it: the first whose ending transition says
    the run was answered (one audited before that flag existed: the first after the answer by
    time), else the current one; then its hand-on, the run's end."""
    run, out = facts.run, []
    if run.answered_at is not None:
        epoch = run.attempt
        for a in facts.audit:
            ended = _ended(a)
            if ended is None:
                continue
            flag = a.detail.get("answered")
            if flag is True or (flag is None and a.at > run.answered_at):
                epoch = ended
                break
        used = _used(run.answer_usage)
        out.append(_Draft(epoch, OWNER, run.answered_at, EventKind.ANSWERED, epoch, None, used))
    if run.status == "succeeded" and run.finished_at is not None:
        kind = EventKind.DELIVERED
        out.append(_Draft(run.attempt, END, run.finished_at, kind, run.attempt, None, {}))
    return out


_ENDINGS = (EventKind.LOST, EventKind.HANDED_BACK)


def _claims(facts: RunFacts, drafts: list[_Draft]) -> list[_Draft]:
    """Each attempt that ran was claimed: the current one once the run's row names a claim
    made after everything before it (a claim begins after the statement that queued its
    attempt committed); an earlier one by its own records or the transition that ended it
    (each needs a running attempt). A run failed while queued was never claimed."""
    run, out = facts.run, []
    for n in range(1, run.attempt + 1):
        ended = next((d for d in drafts if d.attempt == n and d.kind in _ENDINGS), None)
        own = [d for d in drafts if d.epoch == n and d.phase == OWNER]
        before = [d.at for d in drafts if d.epoch < n or (d.epoch == n and d.phase == OPENING)]
        current = (
            n == run.attempt
            and run.status != "queued"
            and run.claimed_at is not None
            and all(t < run.claimed_at for t in before)
        )
        if not (current or own or ended is not None):
            continue
        at, worker = _claim_facts(facts, n, ended, own, current)
        out.append(_Draft(n, CLAIM, at, EventKind.CLAIMED, n, None, {"worker": worker}))
    return out


def _claim_facts(
    facts: RunFacts, n: int, ended: _Draft | None, own: list[_Draft], current: bool
) -> tuple[datetime, str | None]:
    """When attempt n was claimed and by whom, from the record that keeps them: the run's row
    (current attempt), or the audit of the transition that ended it; else its first record."""
    run = facts.run
    if current and run.claimed_at is not None:
        return run.claimed_at, run.claimed_by
    for a in facts.audit:
        d, at = a.detail, None
        if _ended(a) == n:
            at = _instant(d.get("lost_claimed_at") or d.get("faulted_claimed_at"))
            worker = d.get("lost_holder") or d.get("holder")
        elif (a.kind, a.attempt) in (("agent.run.handed_back", n + 1), ("agent.run.waiting", n)):
            at, worker = _instant(d.get("claimed_at")), d.get("worker")
        if at is not None:
            return at, worker
    first = min(own, key=_Draft.key) if own else ended
    assert first is not None  # the caller found a record of the attempt
    worker = next((d.details.get("worker") for d in own if d.details.get("worker")), None)
    return first.at, worker


def read_events(engine: sa.Engine, run_id: str, after: int = 0) -> EventPage:
    """The run's events after `after` (0: all), and its status at the same moment, in one
    statement on a pooled connection (RunNotFound for an unknown run). BadRequest for an
    `after` past the last event of a run not ended: no event had that seq, and following from
    it would skip the ones to come up to it (of an ended run, nothing follows anyway)."""
    with engine.connect() as conn:
        facts = select_run_facts(conn, run_id)
    events = derive(facts)
    last = events[-1].seq if events else 0
    if after > last and facts.run.status not in FINISHED:
        raise BadRequest(
            f"run {run_id}: event {after} is past its last event ({last}); send the seq of "
            "the last event you received (Last-Event-ID), or 0 to read from the first"
        )
    return EventPage(
        run_id, after, tuple(e for e in events if e.seq > after), facts.run.status, max(last, after)
    )


def follow(
    engine: sa.Engine,
    changes: RunChanges,
    run_id: str,
    after: int = 0,
    recheck_s: float = RECHECK_S,
) -> Iterator[RunEvent]:
    """Every event after `after` as it is recorded, until the run has ended and its last event
    was given; between reads it waits on the run's nudge (at most `recheck_s`)."""
    with changes.watch(run_id) as watch:
        while True:
            watch.clear()
            page = read_events(engine, run_id, after)
            yield from page.events
            after = page.last_seq
            if page.done:
                return
            watch.wait(recheck_s)


async def follow_async(
    engine: sa.Engine,
    changes: RunChanges,
    run_id: str,
    after: int = 0,
    recheck_s: float = RECHECK_S,
) -> AsyncIterator[RunEvent]:
    """`follow` for asyncio: each read runs in a worker thread on a pooled connection; the wait
    holds no thread and no connection (an asyncio wake-up from the process's one listener)."""
    with changes.watch(run_id) as watch:
        async for event in follow_watched(engine, watch, after, recheck_s):
            yield event


async def first_page(engine: sa.Engine, changes: RunChanges, run_id: str, after: int) -> Opened:
    """The events after `after`, read under a watch opened first (so no nudge after the read
    is missed), for `Opened.follow` to go on from without reading them again (the SSE route
    and the A2A streams open so); the watch is closed at once when the read fails
    (RunNotFound)."""
    watch = changes.open(run_id)
    try:
        watch.clear()
        page = await asyncio.to_thread(read_events, engine, run_id, after)
    except BaseException:
        changes.close(watch)
        raise
    return Opened(page, watch)


@dataclass(frozen=True)
class Opened:
    """A first page and the watch it was read under (its owner closes it)."""

    page: EventPage
    watch: Watch

    def follow(self, engine: sa.Engine, recheck_s: float = RECHECK_S) -> AsyncIterator[RunEvent]:
        """The page's events, then every later one until the run's last, joined at the page's
        last seq (`follow_watched` from it: nothing read twice, nothing missed)."""
        return follow_watched(engine, self.watch, self.page.after, recheck_s, first=self.page)

    def passed(self) -> Opened:
        """The same watch, its first page's events taken as given (`EventPage.passed`)."""
        return Opened(self.page.passed(), self.watch)


async def follow_watched(
    engine: sa.Engine,
    watch: Watch,
    after: int = 0,
    recheck_s: float = RECHECK_S,
    first: EventPage | None = None,
) -> AsyncIterator[RunEvent]:
    """`follow_async` on a watch its caller opened (and closes): from `first`, a page read
    under it after its last clear, if given, else reading at once."""
    page = first
    while True:
        if page is None:
            watch.clear()
            page = await asyncio.to_thread(read_events, engine, watch.run_id, after)
        for event in page.events:
            yield event
        after = page.last_seq
        if page.done:
            return
        page = None
        await watch.wait_async(recheck_s)


__all__ = [
    "RECHECK_S",
    "EventKind",
    "EventPage",
    "Opened",
    "RunEvent",
    "Watch",
    "derive",
    "first_page",
    "follow",
    "follow_async",
    "follow_watched",
    "read_events",
]
