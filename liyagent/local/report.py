"""The demo's figures as a terminal table (rich) and as a small self-contained HTML report."""

from __future__ import annotations

import html
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from rich.table import Table

from liyagent.local.figures import Figures, RunLine


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
    rows.append(("Recovery after kill, p50", _secs(f.recovery_p50)))
    rows.append(("Recovery after kill, max", _secs(f.recovery_max)))
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


_CSS = (
    "body{font:14px system-ui,sans-serif;margin:2em;color:#222}"
    "table{border-collapse:collapse;margin:1em 0}"
    "td,th{border:1px solid #ccc;padding:4px 8px;text-align:left}"
    "th{background:#f3f3f3}.ok{color:#176317}.bad{color:#a11}code{font-size:12px}"
)


def _tr(cells: list[str], tag: str = "td") -> str:
    return "<tr>" + "".join(f"<{tag}>{html.escape(c)}</{tag}>" for c in cells) + "</tr>"


def render_html(f: Figures, kill: KillNote | None, context: list[str]) -> str:
    """The report as one HTML page with inline CSS and no external resources."""
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
    summary = "".join(_tr([label, value]) for label, value in summary_rows(f))
    head = _tr(list(COLUMNS), "th")
    runs = "".join(_tr(_cells(line)) for line in f.lines)
    notes = "".join(f"<li>{html.escape(n)}</li>" for n in [*legend(f), *context])
    return (
        "<!doctype html><html><head><meta charset='utf-8'><title>liyagent demo</title>"
        f"<style>{_CSS}</style></head><body><h1>liyagent crash-resume demo</h1>"
        f"{verdict}{killed}<table>{summary}</table><h2>Runs</h2><table>{head}{runs}</table>"
        f"<h2>Notes</h2><ul>{notes}</ul></body></html>\n"
    )


def write_html(path: Path, f: Figures, kill: KillNote | None, context: list[str]) -> Path:
    """Write the report to `path` (its directory is created) and return the path."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render_html(f, kill, context))
    return path
