"""The kill trials' verdict: lost, duplicate and stale writes, recovery times, from Postgres
and the vendors' records only; written as a JSON report with a PNG histogram beside it, and an
HTML page beside both showing the histogram and the timelines of the five slowest recoveries."""

from __future__ import annotations

import base64
import html
import json
import math
from dataclasses import asdict, dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from liyagent.local import judge
from store.timeline import Timeline, select_timelines

# How many of the slowest recoveries the report draws the timeline of.
SLOWEST_DRAWN = 5


@dataclass(frozen=True)
class Trial:
    """One record a round started: a webhook call, a Teams turn or a cron fire."""

    kind: str
    ref: str
    round: int
    scheduled_at: datetime | None = None


@dataclass(frozen=True)
class Recovery:
    """One trial caught in flight: the run, the kill (the harness's clock of it), the seconds
    from that kill to the resumed attempt's claim (its first write), and to the trial's end."""

    trial: str
    run_id: str
    killed_at: datetime
    seconds: float
    resume_seconds: float | None = None
    # True when the killed worker had only reserved the run's message (never claimed it).
    reserved: bool = False
    # True when the killed worker's main process led the death watch at the kill.
    leader: bool = False


def _quantiles(samples: list[float]) -> dict[str, float | None]:
    def q(p: float) -> float | None:
        if not samples:
            return None
        ordered = sorted(samples)
        return round(ordered[min(len(ordered) - 1, math.ceil(p * len(ordered)) - 1)], 3)

    return {
        "p50": q(0.5),
        "p95": q(0.95),
        "p99": q(0.99),
        "max": round(max(samples), 3) if samples else None,
    }


@dataclass
class Verdict:
    trials: int = 0
    rounds: int = 0
    caught_in_flight: int = 0
    lost: list[str] = field(default_factory=list)
    duplicate_writes: dict[str, int] = field(default_factory=dict)
    stale_writes: int = 0
    stale_detail: list[str] = field(default_factory=list)
    seed: int = 0
    # The Celery pool the victims and the survivor ran (`-P`): prefork or threads.
    pool: str = "prefork"
    unfinished: int = 0
    # Rounds whose victim led the death watch when it was killed.
    rounds_led: int = 0
    # Claimed by a killed worker: kill -> the resumed attempt's claim, and kill -> the end.
    recovery_s: list[float] = field(default_factory=list)
    resume_s: list[float] = field(default_factory=list)
    # Reserved by a killed worker, never claimed by it: kill -> first claim, kill -> end.
    reserved_s: list[float] = field(default_factory=list)
    reserved_resume_s: list[float] = field(default_factory=list)
    recoveries: list[Recovery] = field(default_factory=list)
    # The slowest recoveries with their runs' timelines, read while the database is there.
    slowest: list[tuple[Recovery, Timeline]] = field(default_factory=list)

    def by_victim(self) -> dict[str, dict[str, Any]]:
        """Trials the killed worker had claimed, split by whether it led the death watch at
        the kill: how many, time to resume and time to end (the leader's death must not be
        slower to recover)."""
        split: dict[str, dict[str, Any]] = {}
        for name, led in (("leader", True), ("follower", False)):
            mine = [r for r in self.recoveries if not r.reserved and r.leader == led]
            resumes = [r.resume_seconds for r in mine if r.resume_seconds is not None]
            split[name] = {
                "trials": len(mine),
                "time_to_resume_s": _quantiles(resumes),
                "time_to_end_s": _quantiles([r.seconds for r in mine]),
            }
        return split

    @property
    def duplicates(self) -> int:
        return sum(self.duplicate_writes.values())

    def slow(self, bound_s: float) -> list[Recovery]:
        """Trials caught in flight (claimed or only reserved) that ended later than the bound
        after their kill: each one fails the trials (the spec's table)."""
        return [r for r in self.recoveries if r.seconds > bound_s]

    def passed(self, recovery_bound_s: float | None) -> bool:
        slow = recovery_bound_s is not None and bool(self.slow(recovery_bound_s))
        return not self.lost and not self.duplicates and not self.stale_writes and not slow

    def to_json(self) -> dict[str, Any]:
        return {
            "pool": self.pool,
            "trials": self.trials,
            "rounds": self.rounds,
            "caught_in_flight": self.caught_in_flight,
            "caught_before_claim": len(self.reserved_s),
            "lost": len(self.lost),
            "lost_trials": self.lost,
            "duplicate_writes": self.duplicates,
            "duplicate_writes_by_vendor": self.duplicate_writes,
            "stale_writes": self.stale_writes,
            "stale_write_detail": self.stale_detail,
            # Kill -> the trial's end (the spec's measure), trials the killed worker had claimed.
            "recovery_s": _quantiles(self.recovery_s),
            "time_to_end_s": _quantiles(self.recovery_s),
            # Kill -> the resumed attempt's claim (its first write).
            "time_to_resume_s": _quantiles(self.resume_s),
            # Trials whose message the killed worker had reserved but not claimed.
            "reserved_time_to_end_s": _quantiles(self.reserved_s),
            "reserved_time_to_resume_s": _quantiles(self.reserved_resume_s),
            # The same, split by whether the killed worker led the death watch at the kill.
            "rounds_victim_led": self.rounds_led,
            "by_victim": self.by_victim(),
            "seed": self.seed,
        }


def trial_end(conn: sa.Connection, trial: Trial) -> judge.TrialEnd:
    if trial.kind == "webhook":
        return judge.webhook_end(conn, trial.ref)
    if trial.kind == "teams":
        return judge.teams_end(conn, trial.ref)
    assert trial.scheduled_at is not None
    return judge.cron_end(conn, trial.ref, trial.scheduled_at)


@dataclass(frozen=True)
class Victim:
    """One victim worker's life: from ready to SIGKILL, the holders (main process and pool
    children) it killed, and whether it led the death watch when it was killed."""

    up_at: datetime
    killed_at: datetime
    holders: frozenset[str] = frozenset()
    led: bool = False


def judge_trials(
    engine: sa.Engine,
    vendor: sa.Engine,
    trials: list[Trial],
    victims: list[Victim],
    seed: int,
    pool: str = "prefork",
) -> Verdict:
    """Judge every trial from the database: how it ended, what it wrote, how fast it came back."""
    verdict = Verdict(
        trials=len(trials),
        rounds=len(victims),
        seed=seed,
        rounds_led=sum(v.led for v in victims),
        pool=pool,
    )
    with engine.connect() as conn, vendor.connect() as vconn:
        ends = {t: trial_end(conn, t) for t in trials}
        run_ids = [e.run_id for e in ends.values() if e.run_id]
        losses = judge.losses(conn, run_ids)
        for trial, end in ends.items():
            _judge_one(verdict, conn, vconn, trial, end, losses.get(end.run_id or "", []), victims)
        verdict.duplicate_writes = judge.duplicate_writes(vconn, run_ids)
        verdict.slowest = slowest_timelines(conn, verdict.recoveries)
    return verdict


def slowest_timelines(
    conn: sa.Connection, recoveries: list[Recovery]
) -> list[tuple[Recovery, Timeline]]:
    """The slowest recoveries (up to SLOWEST_DRAWN), slowest first, each with its run's
    timeline read from Postgres."""
    top = sorted(recoveries, key=lambda r: r.seconds, reverse=True)[:SLOWEST_DRAWN]
    timelines = {t.run_id: t for t in select_timelines(conn, [r.run_id for r in top])}
    return [(r, timelines[r.run_id]) for r in top if r.run_id in timelines]


def _judge_one(
    v: Verdict,
    conn: sa.Connection,
    vconn: sa.Connection,
    trial: Trial,
    end: judge.TrialEnd,
    losses: list[judge.Loss],
    victims: list[Victim],
) -> None:
    name = f"{trial.kind}:{trial.ref}"
    replies = judge.teams_replies(vconn, end.run_id) if trial.kind == "teams" and end.run_id else 1
    if not end.ended or end.failed or end.run_id is None or replies == 0:
        v.lost.append(name)
    for loss in losses:
        assert end.run_id is not None
        engine_n, vendor_n = judge.stale_writes(conn, vconn, end.run_id, loss)
        if engine_n or vendor_n:
            v.stale_writes += engine_n + vendor_n
            v.stale_detail.append(
                f"{name} run {end.run_id} attempt {loss.attempt}: "
                f"{engine_n} in Postgres, {vendor_n} at vendors after "
                f"{loss.taken_over_at.isoformat()}"
            )
    if end.run_id is None or end.ended_at is None:
        return
    claims = judge.claims(conn, end.run_id)
    if losses:
        _claimed_in_flight(v, name, end.run_id, end.ended_at, losses[-1], claims, victims)
    elif trial.round < len(victims):
        _reserved_in_flight(v, name, end.run_id, end.ended_at, claims, victims[trial.round])


def _claimed_in_flight(
    v: Verdict,
    name: str,
    run_id: str,
    ended_at: datetime,
    loss: judge.Loss,
    claims: dict[int, judge.Claim],
    victims: list[Victim],
) -> None:
    """A trial a killed worker had claimed: timed from the kill of the victim that held it."""
    v.caught_in_flight += 1
    victim = _victim_of(loss, victims)
    if victim is None:
        return
    killed = victim.killed_at
    resume = None
    at = judge.resumed_at(loss, claims)
    if at is not None:
        resume = (at - killed).total_seconds()
        v.resume_s.append(resume)
    seconds = (ended_at - killed).total_seconds()
    v.recovery_s.append(seconds)
    v.recoveries.append(Recovery(name, run_id, killed, seconds, resume, leader=victim.led))


def _reserved_in_flight(
    v: Verdict,
    name: str,
    run_id: str,
    ended_at: datetime,
    claims: dict[int, judge.Claim],
    victim: Victim,
) -> None:
    """A trial never lost whose first claim came after its round's victim died, by a worker
    that was not a victim: the victim had reserved its message and died before claiming it."""
    first = claims.get(1)
    if first is None or first.claimed_at is None or first.claimed_at <= victim.killed_at:
        return
    if first.holder is None or first.holder in victim.holders:
        return
    seconds = (ended_at - victim.killed_at).total_seconds()
    resume = (first.claimed_at - victim.killed_at).total_seconds()
    v.reserved_s.append(seconds)
    v.reserved_resume_s.append(resume)
    v.recoveries.append(
        Recovery(name, run_id, victim.killed_at, seconds, resume, reserved=True, leader=victim.led)
    )


def _victim_of(loss: judge.Loss, victims: list[Victim]) -> Victim | None:
    """The victim whose SIGKILL lost this attempt: the one alive when it was claimed."""
    claimed = loss.attempt_claimed_at
    if claimed is None:
        return None
    for victim in victims:
        if victim.up_at - timedelta(seconds=1) <= claimed <= victim.killed_at:
            return victim
    return None


# The spec's bound on a trial's recovery: over it, a trial fails.
RECOVERY_BOUND_S = 15.0


def report_extra(timings: Any, options: Any) -> dict[str, Any]:
    """What a report records besides the verdict: the commit measured, the bound, the kill
    window and every timing the trials ran with."""
    return {
        "commit": measured_commit(),
        "recovery_bound_s": RECOVERY_BOUND_S,
        "kill_window_s": list(options.kill_window_s),
        "timings": asdict(timings),
        "pool": options.pool,
        "victim_concurrency": options.victim_concurrency,
        "survivor_concurrency": options.survivor_concurrency,
        "step_latency_ms": options.step_latency_ms,
    }


def measured_commit() -> dict[str, Any]:
    """The commit the trials ran on, and whether the tree had changes beyond it."""
    import subprocess

    def git(*args: str) -> str:
        try:
            return subprocess.run(
                ["git", *args], capture_output=True, text=True, timeout=10, check=False
            ).stdout.strip()
        except OSError:
            return ""

    return {"sha": git("rev-parse", "HEAD") or None, "dirty": bool(git("status", "--porcelain"))}


def write_report(verdict: Verdict, path: Path, extra: dict[str, Any]) -> Path:
    """The JSON report at `path`, a histogram of recovery times beside it (same name, .png),
    and an HTML page (same name, .html) with the histogram and the timelines of the slowest
    recoveries next to it; returns the histogram's path."""
    path.parent.mkdir(parents=True, exist_ok=True)
    page = path.with_suffix(".html")
    body = {
        **verdict.to_json(),
        **extra,
        "recovery_samples_s": sorted(verdict.recovery_s),
        "slowest_recoveries": [
            {
                "trial": r.trial,
                "run_id": r.run_id,
                "recovery_s": round(r.seconds, 3),
                "victim_led": r.leader,
            }
            for r, _ in verdict.slowest
        ],
        "timelines_page": page.name,
    }
    path.write_text(json.dumps(body, indent=2, default=str) + "\n")
    png = path.with_suffix(".png")
    _histogram(verdict, png, extra.get("recovery_bound_s"))
    page.write_text(_page(verdict, png))
    return png


def _page(verdict: Verdict, png: Path) -> str:
    """The histogram (embedded, so the page stands alone) and the slowest five timelines."""
    from liyagent import timeline_marks, timeline_page

    encoded = base64.b64encode(png.read_bytes()).decode()
    sections = []
    for r, t in verdict.slowest:
        kill = timeline_marks.KillMark(r.killed_at, "victim SIGKILLed")
        sections.append(
            f"<p><b>{html.escape(r.trial)}</b>: {r.seconds:.3f} s from the kill to its end</p>"
            + timeline_page.html_section(t, [kill])
        )
    slowest = "".join(sections) or "<p>No trial was caught in flight: no timeline to draw.</p>"
    return timeline_page.html_page(
        "liyagent kill trials",
        f"<p>{html.escape(summary_line(verdict))}</p>"
        f"{_by_victim_table(verdict)}"
        f"<img alt='recovery histogram' src='data:image/png;base64,{encoded}'>"
        f"<h2>The slowest recoveries (up to {SLOWEST_DRAWN})</h2>{slowest}",
    )


VICTIM_NAMES = {
    "leader": "Led the death watch",
    "follower": "Followed it",
}


def _by_victim_table(verdict: Verdict) -> str:
    """Time to resume and to end of the trials the killed worker had claimed, one row for
    victims that led the death watch at the kill and one for the others."""
    head = "".join(
        f"<th>{h}</th>"
        for h in (
            "Killed worker",
            "Trials it had claimed",
            "Time to resume p50 / p95 / max",
            "Time to end p50 / p95 / max",
        )
    )
    rows = []
    for name, split in verdict.by_victim().items():
        resume, end = split["time_to_resume_s"], split["time_to_end_s"]
        cells = [VICTIM_NAMES[name], str(split["trials"]), _spread(resume), _spread(end)]
        rows.append("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in cells) + "</tr>")
    return f"<h2>Time to resume by victim</h2><table><tr>{head}</tr>{''.join(rows)}</table>"


def _spread(q: dict[str, float | None]) -> str:
    if q["p50"] is None:
        return "none measured"
    return f"{q['p50']} s / {q['p95']} s / {q['max']} s"


def _histogram(verdict: Verdict, png: Path, target: float | None) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 3.6), dpi=110)
    # No trial caught in flight: an empty axis, never a made-up sample.
    top = max(16.0, max(verdict.recovery_s, default=0.0) + 1)
    ax.hist(verdict.recovery_s, bins=[x / 2 for x in range(int(top * 2) + 1)], color="#3b6ea8")
    if not verdict.recovery_s:
        ax.text(0.5, 0.5, NONE_IN_FLIGHT, transform=ax.transAxes, ha="center", va="center")
    if target is not None:
        ax.axvline(target, color="#b03a2e", linestyle="--", label=f"target {target:g} s")
        ax.legend()
    ax.set_xlabel("recovery: kill to the trial's end (s)")
    ax.set_ylabel("trials caught in flight")
    ax.set_ylim(bottom=0)
    ax.set_title(
        f"-P {verdict.pool}: {verdict.trials} trials, {verdict.caught_in_flight} caught in flight, "
        f"{len(verdict.lost)} lost, {verdict.duplicates} duplicate writes"
    )
    fig.tight_layout()
    fig.savefig(png)
    plt.close(fig)


NONE_IN_FLIGHT = "no trial was caught in flight, so no recovery time was measured"


def _figures(q: dict[str, float | None]) -> str:
    return f"p50 {q['p50']} s p95 {q['p95']} s p99 {q['p99']} s max {q['max']} s"


def recovery_words(verdict: Verdict) -> str:
    """The recovery figures, or why there are none (never `None s`): time to end and time to
    resume for trials the killed worker had claimed, then those it had only reserved."""
    data = verdict.to_json()
    if not verdict.recovery_s and not verdict.reserved_s:
        return f"recovery: {NONE_IN_FLIGHT}"
    words = []
    if verdict.recovery_s:
        resume = _figures(data["time_to_resume_s"]) if verdict.resume_s else "not measured"
        words.append(f"time to end {_figures(data['time_to_end_s'])}; time to resume {resume}")
    if verdict.recovery_s:
        words.append(_by_victim_words(verdict))
    if verdict.reserved_s:
        words.append(
            f"reserved, not claimed ({len(verdict.reserved_s)}): time to end "
            f"{_figures(data['reserved_time_to_end_s'])}"
        )
    return "; ".join(words)


def _by_victim_words(verdict: Verdict) -> str:
    """Time to resume p50 for claimed trials whose victim led the death watch and the others."""
    parts = []
    for name, split in verdict.by_victim().items():
        p50 = split["time_to_resume_s"]["p50"]
        said = "not measured" if p50 is None else f"p50 {p50} s"
        who = "victim leading the death watch" if name == "leader" else "other victims"
        parts.append(f"{who} ({split['trials']}): time to resume {said}")
    return ", ".join(parts)


def summary_line(verdict: Verdict) -> str:
    data = verdict.to_json()
    return (
        f"pool {data['pool']}, trials {data['trials']} (rounds {data['rounds']}), caught in flight "
        f"{data['caught_in_flight']} (+{data['caught_before_claim']} reserved, not claimed), "
        f"lost {data['lost']}, duplicate writes "
        f"{data['duplicate_writes']}, stale writes {data['stale_writes']}, "
        f"{recovery_words(verdict)}, seed {data['seed']}"
    )


__all__ = [
    "NONE_IN_FLIGHT",
    "Recovery",
    "Trial",
    "Verdict",
    "asdict",
    "judge_trials",
    "recovery_words",
    "report_extra",
    "slowest_timelines",
    "summary_line",
    "write_report",
]
