"""A run's timeline as HTML: its picture as inline SVG (liyagent/timeline.py), a table of its
attempts (worker, claim, last record, how it ended) and of its calls (marked, settled, how),
and the calls each resume took up. Self-contained: inline CSS and SVG, no script, nothing
fetched."""

from __future__ import annotations

import html
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path

from liyagent.timeline import svg
from liyagent.timeline_marks import KillMark, colour
from store.timeline import Timeline


def _secs(t: Timeline, at: datetime | None) -> str:
    return "-" if at is None else f"{(at - t.created_at).total_seconds():.2f} s"


def _attempt_rows(t: Timeline) -> str:
    rows = []
    for a in t.attempts:
        cells = [
            str(a.attempt),
            a.holder or "not recorded",
            _secs(t, a.claimed_at),
            _secs(t, a.last_record_at),
            a.end or "running",
            _secs(t, a.ended_at),
        ]
        rows.append(_tr(cells))
    head = _tr(["attempt", "worker", "claimed", "last record", "ended", "at"], "th")
    return f"<table class='attempts'>{head}{''.join(rows)}</table>"


def _call_rows(t: Timeline) -> str:
    """The marked calls, then the calls each resume took up (reads included)."""
    out = "<p>No call was marked: the run made no write.</p>"
    if t.calls:
        head = _tr(["step", "call", "tool", "kind", "marked", "settled", "how it ended"], "th")
        rows = [
            _tr(
                [
                    str(c.step),
                    c.call_id,
                    c.tool,
                    c.kind,
                    _secs(t, c.marked_at),
                    _secs(t, c.settled_at),
                    c.outcome,
                ],
                outcome=c.outcome,
            )
            for c in t.calls
        ]
        out = f"<table class='calls'>{head}{''.join(rows)}</table>"
    taken = [
        _tr(
            [str(e.attempt), _secs(t, e.at), str(e.step), k.call_id, k.tool, k.kind, k.settled],
            outcome=k.settled,
        )
        for e in t.resumes
        for k in e.calls
    ]
    if taken:
        head = _tr(["resumed by attempt", "at", "step", "call", "tool", "kind", "taken up"], "th")
        out += f"<table class='resumes'>{head}{''.join(taken)}</table>"
    return out


def _tr(cells: list[str], tag: str = "td", outcome: str | None = None) -> str:
    swatch = ""
    if outcome is not None:
        swatch = f"<span class='sw' style='background:{colour(outcome)}'></span>"
    body = "".join(f"<{tag}>{html.escape(c)}</{tag}>" for c in cells[:-1])
    last = f"<{tag}>{swatch}{html.escape(cells[-1])}</{tag}>" if cells else ""
    return f"<tr>{body}{last}</tr>"


def html_section(t: Timeline, kills: Sequence[KillMark] = ()) -> str:
    """One run's timeline for an HTML page: the picture (inline SVG), its attempts and calls."""
    return (
        f"<section class='timeline' id='timeline-{html.escape(t.run_id)}'>"
        f"<h3>Run {html.escape(t.run_id)}</h3>"
        f"<figure>{svg(t, kills)}</figure>"
        f"{_attempt_rows(t)}{_call_rows(t)}</section>"
    )


CSS = (
    "body{font:14px system-ui,sans-serif;margin:2em;color:#222}"
    "table{border-collapse:collapse;margin:1em 0}"
    "td,th{border:1px solid #ccc;padding:4px 8px;text-align:left}"
    "th{background:#f3f3f3}figure{margin:0}"
    ".sw{display:inline-block;width:.8em;height:.8em;margin-right:.4em;border:1px solid #333;"
    "vertical-align:middle}section.timeline{margin:2em 0;border-top:1px solid #ddd}"
)


def html_page(title: str, body: str) -> str:
    """A self-contained page (inline CSS and SVG, no script, no external resource)."""
    return (
        f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
        f"<style>{CSS}</style></head><body><h1>{html.escape(title)}</h1>{body}</body></html>\n"
    )


def write_html(path: Path, t: Timeline, kills: Sequence[KillMark] = ()) -> Path:
    """One run's timeline as a self-contained HTML page at `path`."""
    path.write_text(html_page(f"Timeline of run {t.run_id}", html_section(t, kills)))
    return path
