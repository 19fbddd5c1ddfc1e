"""The demo's verdict, read from Postgres and from the vendor simulator's own records.

Duplicates are judged by the vendor, never by the engine: more than one incident, comment or
chat reply row for one idempotency key is a write that happened twice. A Teams turn's reply is
posted to the Bot Connector with the key `lya-teams-reply-<run id>`: exactly one post each is
right.
"""

from __future__ import annotations

import statistics
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import datetime
from typing import Any

import sqlalchemy as sa

from liyagent.local.judge import claims, losses, resumed_at
from runtime.entries.teams.reply import teams_reply_key
from simulators.vendor import (
    chat_replies_by_key,
    comments_by_key,
    connector_posts_by_key,
    incidents_by_key,
)
from store.records import select_audit
from store.states import FINISHED
from store.views import RunSummary, mark_keys, mark_tally, runs_by_ids

# Vendor record tables, by the tool that writes them.
VENDOR_TABLES: dict[str, tuple[str, Callable[[sa.Connection], dict[str, int]]]] = {
    "incident.create": ("incidents", incidents_by_key),
    "issue.comment": ("comments", comments_by_key),
    "chat.reply": ("chat replies", chat_replies_by_key),
}
TEAMS_RECORD = "Teams replies"


@dataclass(frozen=True)
class RunLine:
    """One run of the batch as the report shows it."""

    id: str
    status: str
    attempt: int
    lost_count: int
    step: int
    in_flight_at_kill: bool
    recovery_s: float | None
    failure_reason: str | None
    # Kill -> the claim of the attempt that took the run up again (a run lost at the kill).
    resume_s: float | None = None
    # How each call its resume found was taken up (made, reused, resent, read_back, ...).
    resume: tuple[str, ...] = ()
    # How the run was started: api (the client), teams or webhook (the app front).
    via: str = "api"


@dataclass(frozen=True)
class Figures:
    """Everything the demo reports: outcomes, settlements, vendor duplicates, recovery."""

    lines: list[RunLine]
    settlements: dict[str, dict[str, int]]
    resume_calls: dict[str, int]
    vendor_rows: dict[str, int]
    duplicates: dict[str, int]
    recovery: list[float] = field(default_factory=list)
    # Each Teams turn's run id -> reply rows the chat vendor holds for its key (1 is right).
    teams_replies: dict[str, int] = field(default_factory=dict)

    def count(self, status: str) -> int:
        """Runs that ended in `status`."""
        return sum(1 for line in self.lines if line.status == status)

    @property
    def lost(self) -> int:
        """Runs that neither succeeded nor failed by the deadline."""
        return sum(1 for line in self.lines if line.status not in FINISHED)

    @property
    def resumed(self) -> int:
        """Runs lost at least once and taken up again."""
        return sum(1 for line in self.lines if line.lost_count > 0)

    @property
    def duplicate_writes(self) -> int:
        """Extra vendor rows for one idempotency key, over every record kind."""
        return sum(self.duplicates.values())

    @property
    def recovery_p50(self) -> float | None:
        """Median seconds from the kill to the end of a run that was in flight."""
        return round(statistics.median(self.recovery), 2) if self.recovery else None

    @property
    def resume_p50(self) -> float | None:
        """Median seconds from the kill to the resumed attempt's claim (its first write)."""
        times = [line.resume_s for line in self.lines if line.resume_s is not None]
        return round(statistics.median(times), 2) if times else None

    @property
    def recovery_max(self) -> float | None:
        """Slowest recovery of a run that was in flight at the kill, in seconds."""
        return round(max(self.recovery), 2) if self.recovery else None

    @property
    def teams_replied_once(self) -> int:
        """Teams turns whose reply the chat vendor holds exactly once."""
        return sum(1 for n in self.teams_replies.values() if n == 1)

    def via(self, entry: str) -> int:
        """Runs started through `entry` (api, teams or webhook)."""
        return sum(1 for line in self.lines if line.via == entry)

    @property
    def ok(self) -> bool:
        """The demo passes: nothing lost or failed, no write repeated, every Teams turn
        replied to exactly once."""
        return (
            self.lost == 0
            and self.duplicate_writes == 0
            and self.count("failed") == 0
            and self.teams_replied_once == len(self.teams_replies)
        )

    def to_json(self) -> dict[str, Any]:
        """The figures as the JSON object `liyagent demo --json` prints."""
        return {
            "runs": len(self.lines),
            "succeeded": self.count("succeeded"),
            "failed": self.count("failed"),
            "lost": self.lost,
            "resumed": self.resumed,
            "duplicate_writes": self.duplicate_writes,
            "recovery_s": {"p50": self.recovery_p50, "max": self.recovery_max},
            "time_to_resume_s": {"p50": self.resume_p50},
            "started_via": {e: self.via(e) for e in ("api", "teams", "webhook")},
            "teams_turns": len(self.teams_replies),
            "teams_replied_once": self.teams_replied_once,
            "teams_replies": self.teams_replies,
            "duplicates_by_record": self.duplicates,
            "vendor_rows": self.vendor_rows,
            "settlements": self.settlements,
            "resume_settlements": self.resume_calls,
            "run_rows": [asdict(line) for line in self.lines],
        }


def _label(status: str, settlement: str | None) -> str:
    if settlement:
        return settlement
    return {"done": "sent once", "in_doubt": "still in doubt"}.get(status, status)


def _settlements(conn: sa.Connection, run_ids: list[str]) -> dict[str, dict[str, int]]:
    """Call marks counted by kind and by how each ended (settlement, else status)."""
    out: dict[str, dict[str, int]] = {}
    for tally in mark_tally(conn, run_ids):
        by_kind = out.setdefault(tally.kind, {})
        label = _label(tally.status, tally.settlement)
        by_kind[label] = by_kind.get(label, 0) + tally.n
    return out


def _resume_calls(conn: sa.Connection, run_id: str) -> tuple[str, ...]:
    """How the run's resumes settled each call they found, from its crash_resumed audit."""
    settled: list[str] = []
    for event in select_audit(conn, run_id, "agent.run.crash_resumed"):
        settled.extend(str(c.get("settled")) for c in event.detail.get("calls", []))
    return tuple(settled)


def _vendor(
    sim: sa.Connection, keys_by_tool: dict[str, set[str]], teams: list[str]
) -> tuple[dict[str, int], dict[str, int], dict[str, int]]:
    """Rows the vendor holds for this batch's keys, the extra rows (duplicates), and the
    reply rows of each Teams turn."""
    rows: dict[str, int] = {}
    extra: dict[str, int] = {}
    for tool, (record, by_key) in VENDOR_TABLES.items():
        ours = keys_by_tool.get(tool, set())
        counts = {k: n for k, n in by_key(sim).items() if k in ours}
        rows[record] = sum(counts.values())
        extra[record] = sum(n - 1 for n in counts.values() if n > 1)
    replies = connector_posts_by_key(sim) if teams else {}
    per_turn = {run_id: replies.get(teams_reply_key(run_id), 0) for run_id in teams}
    if teams:
        rows[TEAMS_RECORD] = sum(per_turn.values())
        extra[TEAMS_RECORD] = sum(n - 1 for n in per_turn.values() if n > 1)
    return rows, extra, per_turn


def _resumed_after(conn: sa.Connection, run_id: str, kill_at: datetime) -> float | None:
    """Seconds from the kill to the claim of the attempt that took the run up after it (the
    attempt after the first loss seen since the kill), from the claims' own records."""
    since = [
        loss for loss in losses(conn, [run_id]).get(run_id, []) if loss.taken_over_at >= kill_at
    ]
    at = resumed_at(since[0], claims(conn, run_id)) if since else None
    return None if at is None else round(max((at - kill_at).total_seconds(), 0.0), 2)


def _line(
    conn: sa.Connection,
    run: RunSummary,
    in_flight: set[str],
    kill_at: datetime | None,
    via: dict[str, str],
) -> RunLine:
    """One run's report row, with its recovery time if it was in flight at the kill."""
    recovery = resume = None
    if run.id in in_flight and kill_at is not None and run.finished_at is not None:
        recovery = round(max((run.finished_at - kill_at).total_seconds(), 0.0), 2)
    if run.id in in_flight and kill_at is not None and run.lost_count:
        resume = _resumed_after(conn, run.id, kill_at)
    return RunLine(
        id=run.id,
        status=run.status,
        attempt=run.attempt,
        lost_count=run.lost_count,
        step=run.step,
        in_flight_at_kill=run.id in in_flight,
        recovery_s=recovery,
        failure_reason=run.failure_reason,
        resume_s=resume,
        resume=_resume_calls(conn, run.id) if run.lost_count else (),
        via=via.get(run.id, "api"),
    )


def collect(
    engine: sa.Engine,
    sim_engine: sa.Engine,
    run_ids: list[str],
    in_flight: set[str],
    kill_at: datetime | None,
    via: dict[str, str] | None = None,
) -> Figures:
    """Read the batch's outcome from Postgres and the vendor's records; `via` names the runs
    the front started (run id -> teams or webhook), the rest came through the client API."""
    via = via or {}
    teams = [run_id for run_id in run_ids if via.get(run_id) == "teams"]
    with engine.connect() as conn:
        lines = [_line(conn, r, in_flight, kill_at, via) for r in runs_by_ids(conn, run_ids)]
        settlements = _settlements(conn, run_ids)
        resume_calls = dict(sorted(Counter(s for line in lines for s in line.resume).items()))
        keys_by_tool: dict[str, set[str]] = {}
        for key in mark_keys(conn, run_ids):
            keys_by_tool.setdefault(key.tool, set()).add(key.idem_key)
    with sim_engine.connect() as sim:
        vendor_rows, duplicates, teams_replies = _vendor(sim, keys_by_tool, teams)
    return Figures(
        lines=lines,
        settlements=settlements,
        resume_calls=resume_calls,
        vendor_rows=vendor_rows,
        duplicates=duplicates,
        recovery=[line.recovery_s for line in lines if line.recovery_s is not None],
        teams_replies=teams_replies,
    )
