"""The demo's figures as a terminal table (rich) and as a small self-contained HTML report,
with the timeline of every run that was resumed (drawn from Postgres, liyagent/timeline.py)."""

from __future__ import annotations

import html
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from rich.table import Table

from liyagent import timeline_marks, timeline_page
from liyagent.local.figures import Figures, RunLine
from store.timeline import Timeline


@dataclass(frozen=True)
class KillNote:
    """Which worker was killed, when (database clock) and which runs it had in flight."""

    worker: str
    at: datetime
    in_flight: list[str]


KIND_NAMES = {"keyed_write": "Keyed writes (incident)", "write": "Writes (comment, chat)"}
LEGEND = {
    "sent once": "made once, its outcome recorded",
    "made": "a read (or an unsent call) made by the resume",
    "reused": "its recorded outcome reused; not sent again",
    "resent": "a keyed write sent again with its key; the vendor deduplicated it",
    "read_back": "a write found at the vendor by its key; not sent again",
    "sent_after_read_back": "its reader proved it never landed, so it was sent once",
    "unknown": "maybe sent, no reader: not sent again, the model was told",
    "still in doubt": "marked before sending, never settled",
}


def runs_word(n: int) -> str:
    """`1 run`, `3 runs`."""
    return f"{n} run" if n == 1 else f"{n} runs"


def _secs(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f} s"


def _mix(counts: dict[str, int]) -> str:
    return ", ".join(f"{n} {label}" for label, n in sorted(counts.items())) or "none"


VIA_NAMES = {"api": "client API", "teams": "Teams", "webhook": "webhook"}


def _via(f: Figures) -> str:
    parts = [f"{f.via(entry)} {name}" for entry, name in VIA_NAMES.items() if f.via(entry)]
    return ", ".join(parts) or "none"


def summary_rows(f: Figures) -> list[tuple[str, str]]:
    """The headline figures as (label, value) rows, shared by the table and the HTML."""
    rows = [
        ("Runs", str(len(f.lines))),
        ("Started through", _via(f)),
        ("Succeeded", str(f.count("succeeded"))),
        ("Failed", str(f.count("failed"))),
        ("Lost (not ended)", str(f.lost)),
        ("Resumed after a loss", str(f.resumed)),
    ]
    for kind, counts in sorted(f.settlements.items()):
        rows.append((f"{KIND_NAMES.get(kind, kind)} calls", _mix(counts)))
    rows.append(("Calls taken up on resume", _mix(f.resume_calls)))
    rows.append(("Vendor records written", _mix(f.vendor_rows)))
    if f.teams_replies:
        once = f"{f.teams_replied_once} of {len(f.teams_replies)}"
        rows.append(("Teams replies posted exactly once", once))
    rows.append(("Duplicate writes (vendor)", str(f.duplicate_writes)))
    rows.append(("Kill to resumed attempt, p50", _secs(f.resume_p50)))
    rows.append(("Kill to run end (recovery), p50", _secs(f.recovery_p50)))
    rows.append(("Kill to run end (recovery), max", _secs(f.recovery_max)))
    return rows


def legend(f: Figures) -> list[str]:
    """What each settlement word that appears in the figures means."""
    seen = {label for counts in f.settlements.values() for label in counts}
    seen |= set(f.resume_calls)
    return [f"{word}: {LEGEND[word]}" for word in sorted(seen) if word in LEGEND]


def summary_table(f: Figures, kill: KillNote | None) -> Table:
    """The verdict table printed at the end of the demo."""
    title = "Crash-resume demo"
    if kill is not None:
        title += f": {kill.worker} SIGKILLed with {runs_word(len(kill.in_flight))} in flight"
    table = Table(title=title, show_header=False, title_justify="left", caption_justify="left")
    table.add_column("figure", style="bold", no_wrap=True)
    table.add_column("value")
    for label, value in summary_rows(f):
        table.add_row(label, value)
    table.caption = "\n".join(legend(f))
    return table


def runs_table(f: Figures) -> Table:
    """One row per run: how it came, status, attempts, losses, its resume and its recovery
    if killed."""
    table = Table(title="Runs", title_justify="left")
    shown = [i for i, col in enumerate(COLUMNS) if col not in BRIEF_OMITS]
    for i in shown:
        table.add_column(COLUMNS[i])
    for line in f.lines:
        cells = [line.id[:8], *_cells(line)[1:]]
        table.add_row(*(cells[i] for i in shown))
    return table


COLUMNS = ("run", "via", "status", "attempt", "lost", "steps", "resume took up", "recovery")
# Left out of the terminal table so it fits 80 columns (the HTML report has every column).
BRIEF_OMITS = ("attempt", "steps")


def _cells(line: RunLine) -> list[str]:
    """One run's row: the resume column lists how each call it found was settled."""
    took_up = ", ".join(line.resume) or ("nothing pending" if line.lost_count else "")
    return [
        line.id,
        line.via,
        line.status,
        str(line.attempt),
        str(line.lost_count),
        str(line.step),
        took_up,
        _secs(line.recovery_s),
    ]


def _tr(cells: list[str], tag: str = "td", link: str | None = None) -> str:
    """A table row of escaped cells; `link` makes the first cell a link to that anchor."""
    escaped = [html.escape(c) for c in cells]
    if link is not None and escaped:
        escaped[0] = f"<a href='#{html.escape(link)}'>{escaped[0]}</a>"
    return "<tr>" + "".join(f"<{tag}>{c}</{tag}>" for c in escaped) + "</tr>"


def resumed(timelines: Sequence[Timeline]) -> list[Timeline]:
    """The timelines of the runs taken up again: lost at least once, or resumed."""
    return [t for t in timelines if t.lost_count > 0 or t.resumes]


def _timelines(shown: list[Timeline], kill: KillNote | None) -> str:
    """A section per resumed run: its picture (inline SVG), attempts and calls; the kill is
    marked on the runs it had in flight."""
    if not shown:
        return ""
    sections = []
    for t in shown:
        kills = []
        if kill is not None and t.run_id in kill.in_flight:
            kills = [timeline_marks.KillMark(kill.at, f"{kill.worker} SIGKILLed")]
        sections.append(timeline_page.html_section(t, kills))
    return (
        "<h2>Timelines of the resumed runs</h2><p>Drawn from Postgres alone: each attempt on "
        "the lane of the worker process that held it, the loss and who claimed it, the resume "
        "and every marked call coloured by how it was settled.</p>" + "".join(sections)
    )


def render_html(
    f: Figures, kill: KillNote | None, context: list[str], timelines: Sequence[Timeline] = ()
) -> str:
    """The report as one HTML page with inline CSS and SVG and no external resources; the
    timeline of every resumed run among `timelines` follows the runs table."""
    verdict = (
        '<p class="ok">No run lost, no run failed, no write repeated.</p>'
        if f.ok
        else '<p class="bad">Something went wrong: see the figures below.</p>'
    )
    killed = ""
    if kill is not None:
        killed = (
            f"<p>Worker <b>{html.escape(kill.worker)}</b> was SIGKILLed at "
            f"{html.escape(kill.at.isoformat(timespec='seconds'))} with "
            f"{runs_word(len(kill.in_flight))} in flight.</p>"
        )
    shown = resumed(timelines)
    drawn = {t.run_id for t in shown}
    summary = "".join(_tr([label, value]) for label, value in summary_rows(f))
    head = _tr(list(COLUMNS), "th")
    runs = "".join(
        _tr(_cells(line), link=f"timeline-{line.id}" if line.id in drawn else None)
        for line in f.lines
    )
    notes = "".join(f"<li>{html.escape(n)}</li>" for n in [*legend(f), *context])
    return (
        "<!doctype html><html><head><meta charset='utf-8'><title>liyagent demo</title>"
        f"<style>{timeline_page.CSS}.ok{{color:#176317}}.bad{{color:#a11}}</style></head><body>"
        f"<h1>liyagent crash-resume demo</h1>{verdict}{killed}<table>{summary}</table>"
        f"<h2>Runs</h2><table>{head}{runs}</table>{_timelines(shown, kill)}"
        f"<h2>Notes</h2><ul>{notes}</ul></body></html>\n"
    )


def write_html(
    path: Path,
    f: Figures,
    kill: KillNote | None,
    context: list[str],
    timelines: Sequence[Timeline] = (),
) -> Path:
    """Write the report to `path` (its directory is created) and return the path; the runs
    among `timelines` that were resumed get their timeline drawn."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render_html(f, kill, context, timelines))
    return path
