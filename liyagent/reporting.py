"""What `liyagent status`, `inspect`, `approvals`, `stop` and `call` show, for people and as
JSON: a run's story read from Postgres, and what an operator's action did. Every audit row
carries its time; the transcript shows each tool call (liyagent/transcript.py) between the
run's input and its answer.

The run's checkpoints (its base and step records, runtime/durable/chain.py) are opened with the
sealer
to show what each step asked for (its history lists every step written); one that fails its seal
is reported as such (never used, never crashed on), exactly as a resume would treat it.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from rich.console import Console
from rich.table import Table
from rich.text import Text

from liyagent.ledger_view import render_entries, render_totals
from liyagent.transcript import CallEntry, tool_calls
from runtime.base.sealing import Sealer, SealError
from runtime.durable import chain
from runtime.durable.formats import NewerFormat
from runtime.flow.waiting import said_of, view_of
from runtime.ops.run_view import RunView
from store.checkpoints import StepRecord, select_marks, select_step_records
from store.ledger import LedgerEntry, run_ledger
from store.records import select_audit, select_transcript
from store.rows import ApprovalRow, AuditRow, MarkRow, RunRow, StopRow, TranscriptRow
from store.runs import get_run_used
from store.states import ApprovalStatus
from store.timeline import select_timeline
from store.usage import UsageTotals
from store.views import RunSummary


@dataclass(frozen=True)
class CheckpointView:
    """One written step as the latest checkpoint tells it: the step, the attempt that wrote
    it, the calls it asked for (or why the checkpoint does not verify); `created_at` is known
    for the latest step only (earlier ones live inside it)."""

    step: int
    attempt: int
    verified: bool
    calls: list[dict[str, str]]
    error: str | None
    created_at: datetime | None


@dataclass(frozen=True)
class RunReport:
    """Everything `inspect` shows about one run."""

    run: RunRow
    answer: str | None
    answer_error: str | None
    checkpoints: list[CheckpointView]
    marks: list[MarkRow]
    audit: list[AuditRow]
    transcript: list[TranscriptRow]
    # Every tool call the run's steps asked for, with its settlement and result (redacted).
    calls: list[CallEntry]
    # Its usage (exact, unconfirmed, with its children's) and its usage rows (store/ledger.py).
    usage: UsageTotals = field(default_factory=UsageTotals)
    ledger: list[LedgerEntry] = field(default_factory=list)


def open_checkpoints(
    sealer: Sealer, run: RunRow, records: Sequence[StepRecord] = ()
) -> list[CheckpointView]:
    """The steps the run's latest checkpoint holds, oldest first; a checkpoint that does not
    verify is reported (one row saying why), never raised."""
    if run.checkpoint is None:
        return []
    written = run.checkpointed_at
    attempt = run.checkpoint_attempt or run.attempt
    try:
        payload = chain.rebuild(sealer, run, records).to_payload()
        asked = [
            [{"id": str(c["id"]), "tool": str(c["name"])} for c in m.get("tool_calls") or []]
            for m in payload.get("messages", [])
            if m.get("role") == "assistant" and m.get("tool_calls")
        ]
        history = list(payload.get("history", []))
        latest = [{"id": str(c["id"]), "tool": str(c["name"])} for c in payload.get("calls", [])]
    except (SealError, NewerFormat, ValueError, KeyError, TypeError, AttributeError) as exc:
        return [CheckpointView(run.step, attempt, False, [], str(exc), written)]
    views = [CheckpointView(0, 1, True, [], None, None)] if run.step > 0 else []
    for entry, calls in zip(history, asked, strict=False):
        step = int(entry.get("step", 0))
        if step < run.step:
            views.append(
                CheckpointView(step, int(entry.get("attempt", 1)), True, calls, None, None)
            )
    views.append(CheckpointView(run.step, attempt, True, latest, None, written))
    return views


def _answer(sealer: Sealer, run: RunRow) -> tuple[str | None, str | None]:
    """The run's sealed answer opened, or why it does not verify."""
    if run.answer is None:
        return None, None
    try:
        return str(sealer.open(run.id, "answer", 0, run.answer)["text"]), None
    except (SealError, ValueError, KeyError, TypeError) as exc:
        return None, str(exc)


def inspect_run(engine: sa.Engine, sealer: Sealer, run_id: str) -> RunReport:
    """Read one run's attempts, checkpoints, marks, audit and transcript."""
    with engine.connect() as conn:
        run, used = get_run_used(conn, run_id)
        ledger = run_ledger(conn, run_id)
        marks = select_marks(conn, run_id)
        records = select_step_records(conn, run_id)
        audit = select_audit(conn, run_id)
        transcript = select_transcript(conn, run_id)
    answer, answer_error = _answer(sealer, run)
    checkpoints = open_checkpoints(sealer, run, records)
    calls = tool_calls(sealer, run, marks, audit, records)
    return RunReport(
        run, answer, answer_error, checkpoints, marks, audit, transcript, calls, used, ledger
    )


def write_timeline(engine: sa.Engine, run_id: str, html: Path | None, png: Path | None) -> None:
    """Draw the run's timeline, read from Postgres alone, into the HTML page and/or PNG asked
    for (see liyagent/timeline.py); raises RunNotFound, or OSError when a file cannot be
    written."""
    from runtime.base.extras import need

    timeline = need("reports", "liyagent.timeline")
    timeline_page = need("reports", "liyagent.timeline_page")

    with engine.connect() as conn:
        t = select_timeline(conn, run_id)
    if html is not None:
        timeline_page.write_html(html, t)
    if png is not None:
        timeline.write_png(png, t)


def _iso(value: datetime | None) -> str | None:
    return None if value is None else value.isoformat()


def run_json(run: RunRow) -> dict[str, Any]:
    """A run's lifecycle fields as JSON (no spec, no sealed bytes)."""
    return {
        "id": run.id,
        "agent": run.agent,
        "kind": run.kind,
        "status": run.status,
        "waiting_on": run.waiting_on,
        # A wait for capacity, decoded: a model endpoint's (endpoint, reason, limit, until) or
        # its tenant's turn (reason tenant, the tenant).
        "waiting_for": view_of(run.waiting_on, run.tenant),
        "tenant": run.tenant,
        "priority": run.priority,
        "attempt": run.attempt,
        "attempts": run.attempt,
        "lost_count": run.lost_count,
        "step": run.step,
        "resume_reason": run.resume_reason,
        # The worker process that took the current attempt: `host-pid`.
        "claimed_by": run.claimed_by,
        "claimed_at": _iso(run.claimed_at),
        "failure_reason": run.failure_reason,
        "created_at": _iso(run.created_at),
        "finished_at": _iso(run.finished_at),
    }


def report_json(r: RunReport) -> dict[str, Any]:
    """The whole inspect report as JSON."""
    return {
        "run": run_json(r.run),
        "answer": r.answer,
        "answer_error": r.answer_error,
        "usage": r.usage.to_json(),
        "ledger": [e.to_json() for e in r.ledger],
        "checkpoints": [{**asdict(c), "created_at": _iso(c.created_at)} for c in r.checkpoints],
        "marks": [
            {
                "step": m.step,
                "call_index": m.call_index,
                "call_id": m.call_id,
                "tool": m.tool,
                "kind": m.kind,
                "idem_key": m.idem_key,
                "status": m.status,
                "settlement": m.settlement,
                "attempt": m.attempt,
            }
            for m in r.marks
        ],
        "audit": [
            {
                "kind": a.kind,
                "attempt": a.attempt,
                "step": a.step,
                "detail": a.detail,
                "created_at": _iso(a.created_at),
            }
            for a in r.audit
        ],
        "transcript": [{"role": t.role, "content": t.content} for t in r.transcript],
        "tool_calls": [{**asdict(c), "at": _iso(c.at)} for c in r.calls],
    }


def view_json(view: RunView) -> dict[str, Any]:
    """The client's view of one run (status, attempt, losses, answer) as JSON."""
    return {"run_id": view.id, **{k: v for k, v in view.to_json().items() if k != "id"}}


def summary_json(s: RunSummary) -> dict[str, Any]:
    """A run summary as JSON, timestamps in ISO 8601."""
    out = asdict(s)
    for key in ("created_at", "started_at", "finished_at"):
        out[key] = _iso(out[key])
    return out


# Columns that hold ids: never wrapped, however narrow the terminal (a wrapped id cannot be
# copied); the table's other columns give way instead.
ID_COLUMNS = frozenset({"run", "approval"})
ID_WIDTH = 36


def _table(title: str, columns: list[str]) -> Table:
    table = Table(title=title, title_justify="left")
    for col in columns:
        if col in ID_COLUMNS:
            table.add_column(col, no_wrap=True, min_width=ID_WIDTH)
        else:
            table.add_column(col, overflow="fold")
    return table


def _row(table: Table, *cells: object) -> None:
    """Add a row of data cells as plain text (never parsed as rich markup)."""
    table.add_row(*(c if isinstance(c, Text) else Text(str(c)) for c in cells))


def _when(value: datetime | None) -> str:
    return "-" if value is None else value.strftime("%Y-%m-%d %H:%M:%S")


def _stamp(value: datetime | None) -> str:
    """A record's time to the millisecond, in UTC (records a few ms apart stay apart)."""
    if value is None:
        return "-"
    return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3] + " UTC"


def render_view(out: Console, view: RunView) -> None:
    """One run's status for a person."""
    table = _table("Run", ["run", "status", "attempt", "lost", "step"])
    _row(table, view.id, view.status, view.attempt, view.lost_count, view.step)
    out.print(table)
    if view.answer is not None:
        out.print(Text(f"Answer: {view.answer}"))
    if view.answer_error:
        out.print(Text(f"Answer: {view.answer_error}"))
    if view.failure_reason:
        out.print(Text(f"Failed: {view.failure_reason}"))
    if view.waiting_on:
        out.print(Text(f"Waiting on: {view.waiting_on}"))
    _render_waiting_for(out, view.waiting_on, view.tenant)


def _render_waiting_for(out: Console, waiting_on: str | None, tenant: str | None) -> None:
    """A wait for capacity, in words: a model endpoint's (reason, until when) or its tenant's
    turn."""
    said = said_of(waiting_on, tenant)
    if said is not None:
        out.print(Text(f"Waiting for: {said}"))


def render_recent(out: Console, runs: list[RunSummary]) -> None:
    """The most recent runs as one table."""
    columns = ["run", "agent", "kind", "status", "attempt", "lost", "step", "created"]
    table = _table("Recent runs", columns)
    for s in runs:
        _row(
            table, s.id, s.agent, s.kind, s.status, s.attempt, s.lost_count, s.step,
            _when(s.created_at),
        )  # fmt: skip
    out.print(table if runs else "No runs yet: start one with `liyagent run`.")


def _render_checkpoints(out: Console, r: RunReport) -> None:
    """The steps written, each with its seal verdict and the calls it asked for."""
    table = _table("Checkpoints", ["step", "written by attempt", "seal", "calls asked"])
    for c in r.checkpoints:
        calls = ", ".join(f"{k['id']} ({k['tool']})" for k in c.calls) or "-"
        seal = Text("verified") if c.verified else Text(f"DOES NOT VERIFY: {c.error}", "red")
        _row(table, c.step, c.attempt, seal, calls)
    out.print(table)


def _render_marks(out: Console, r: RunReport) -> None:
    """Call marks: how each write was marked, sent and settled."""
    table = _table(
        "Call marks", ["step", "call", "tool", "kind", "key", "status", "settlement", "attempt"]
    )
    for m in r.marks:
        key = m.idem_key if len(m.idem_key) <= 20 else m.idem_key[:18] + "…"
        _row(table, m.step, m.call_id, m.tool, m.kind, key, m.status, m.settlement or "-",
             m.attempt)  # fmt: skip
    out.print(table if r.marks else "Call marks: none (the run made no write).")


def _render_audit(out: Console, r: RunReport) -> None:
    table = _table("Audit", ["at", "kind", "attempt", "step", "detail"])
    for a in r.audit:
        detail = json.dumps(a.detail, sort_keys=True)
        _row(table, _stamp(a.created_at), a.kind, a.attempt, a.step, detail)
    out.print(table if r.audit else "Audit: no events.")


def _render_transcript(out: Console, r: RunReport) -> None:
    """The run's input, each tool call (tool, kind, arguments, how it was settled, result),
    then its answer and notices."""
    table = _table("Transcript", ["at", "role", "content"])
    lines = list(r.transcript)
    if lines and lines[0].id == 0:  # the run's input, kept on the run
        first = lines.pop(0)
        _row(table, _stamp(first.created_at), first.role, first.content)
    for c in r.calls:
        content = (
            f"step {c.step} {c.call_id}: {c.tool} ({c.kind}) {c.args}\n-> {c.settled}: {c.result}"
        )
        _row(table, _stamp(c.at), "tool call", content)
    for t in lines:
        _row(table, _stamp(t.created_at), t.role, t.content)
    out.print(table)


def _losses(n: int) -> str:
    return {0: "never lost", 1: "lost once"}.get(n, f"lost {n} times")


def render_report(out: Console, r: RunReport) -> None:
    """The whole inspect report for a person."""
    run = r.run
    out.print(
        Text(
            f"Run {run.id} ({run.kind} {run.agent}): {run.status}, attempt {run.attempt}, "
            f"{_losses(run.lost_count)}, {run.step} steps written",
            "bold",
        )
    )
    if run.claimed_by:
        out.print(
            Text(f"Attempt {run.attempt} claimed by {run.claimed_by} at {_when(run.claimed_at)}")
        )
    if run.waiting_on:
        out.print(Text(f"Waiting on: {run.waiting_on}"))
    _render_waiting_for(out, run.waiting_on, run.tenant)
    if r.answer is not None:
        out.print(Text(f"Answer: {r.answer}"))
    if run.failure_reason:
        out.print(Text(f"Failed: {run.failure_reason}"))
    if r.answer_error:
        out.print(Text(f"Its stored answer does not verify: {r.answer_error}", "red"))
    render_totals(out, r.usage)
    render_entries(out, r.ledger)
    _render_checkpoints(out, r)
    _render_marks(out, r)
    _render_audit(out, r)
    _render_transcript(out, r)


def approval_json(a: ApprovalRow) -> dict[str, Any]:
    """One approval request as JSON: what it holds and how (and by whom) it was decided."""
    return {
        "id": a.id,
        "run_id": a.run_id,
        "step": a.step,
        "tool": a.tool,
        "args": a.args,
        "status": a.status,
        "decided_by": a.decided_by,
        "reason": a.reason,
        "created_at": _iso(a.created_at),
        "decided_at": _iso(a.decided_at),
    }


def render_approvals(out: Console, run_id: str, approvals: list[ApprovalRow]) -> None:
    """A run's approval requests as one table."""
    if not approvals:
        out.print(Text(f"Run {run_id} has asked for no approval."))
        return
    out.print(Text(f"Run {run_id}"), no_wrap=True, overflow="ignore")
    table = _table("Approvals", ["approval", "tool", "step", "status", "by"])
    for a in approvals:
        _row(table, a.id, a.tool, a.step, a.status, a.decided_by or "-")
    out.print(table)


def render_decision(out: Console, a: ApprovalRow) -> None:
    """What a decision did: the call it holds is made (approved) or the model is told (denied)."""
    then = (
        "the call is made"
        if a.status == ApprovalStatus.APPROVED
        else "the model is told it was denied"
    )
    out.print(
        Text(f"Approval {a.id} ({a.tool}) {a.status} by {a.decided_by}; run {a.run_id}: {then}.")
    )


def render_stop(out: Console, target: str, stopped_now: list[str]) -> None:
    """Which runs a Stop failed (at once, children included)."""
    out.print(Text(f"Stop recorded for {target}."))
    if stopped_now:
        out.print(Text(f"Failed now: {', '.join(stopped_now)}"))
    else:
        out.print(Text("No run was queued, waiting or running."))


def render_lift(out: Console, target: str, lifted: list[StopRow]) -> None:
    """Which Stops were lifted (each with who had stopped and why)."""
    if not lifted:
        out.print(Text(f"No stop stands on {target}."))
        return
    for stop in lifted:
        out.print(
            Text(
                f"Lifted stop {stop.id} on {target} (stopped by {stop.created_by}: "
                f"{stop.reason}); its runs are no longer refused."
            )
        )


def render_call(out: Console, result: dict[str, Any]) -> None:
    """An ad hoc call's key, status and outcome."""
    out.print(Text(f"key: {result['key']}"))
    out.print(Text(f"status: {result['status']}"))
    out.print(Text(f"outcome: {json.dumps(result['outcome'], sort_keys=True)}"))
