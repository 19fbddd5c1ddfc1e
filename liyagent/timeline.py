"""A picture of one run's life, drawn from its timeline (store/timeline.py, Postgres alone).

One lane per worker process (its holder, "host-pid"): each attempt is a bar from its claim to
its end; a lost attempt's bar turns hatched after its last record, until the loss was seen and
the run claimed (the red dashed line, naming who claimed it as the claim recorded: the death
watch, the worker's main process or the sweeper). A harness that killed the worker itself (the
demo, the kill trials) may add its kill as a mark; nothing else comes from outside Postgres.
Each marked call is a circle: hollow where it was marked before sending, filled where its
outcome was recorded or it was settled, coloured by its settlement; a resume is a diamond with
the calls it took up as coloured squares beside it; the answer is a star. The x axis is in
seconds since the run was created, by the database's clock.

The same matplotlib figure is written as a PNG (for terminals) and as inline SVG with its text
kept as text (for the self-contained HTML reports, where a browser and a test can read it).
"""

from __future__ import annotations

import io
import re
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

import matplotlib
from matplotlib.artist import Artist
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch
from matplotlib.text import Text

from liyagent.timeline_marks import (
    ANSWER,
    BAR,
    BAR_EDGE,
    KILL,
    LOSS,
    QUEUE,
    QUEUE_LANE,
    SETTLEMENT_COLOURS,
    SETTLEMENT_MEANING,
    KillMark,
    colour,
)
from store.timeline import Timeline, TimelineAttempt, TimelineCall, TimelineEvent


class _Layout:
    """Seconds and lanes: where on the picture each time and each attempt goes."""

    def __init__(self, t: Timeline) -> None:
        self.t = t
        self.origin = t.created_at
        holders = [_holder(a) for a in t.attempts if a.began_at is not None]
        self.lanes = [QUEUE_LANE, *dict.fromkeys(holders)]
        self.end = self.x(t.finished_at or t.read_at)
        # Room below the lanes for the longest list of calls a resume took up.
        longest = max((len(e.calls) for e in t.resumes), default=0)
        self.below = 0.6 + 0.2 * max(longest - 1, 0)

    def x(self, at: datetime) -> float:
        """Seconds since the run was created."""
        return (at - self.origin).total_seconds()

    def xlim(self) -> tuple[float, float]:
        """The axes' span: room on the left for the first attempt's label, on the right for
        the run's end."""
        span = max(self.end, 1.0)
        return -0.14 * span, span * 1.1 + 0.3

    def lane(self, a: TimelineAttempt) -> int:
        return self.lanes.index(_holder(a))

    def attempt_at(self, at: datetime) -> TimelineAttempt | None:
        """The attempt that held the run at `at` (the last one begun by then)."""
        held = [a for a in self.t.attempts if a.began_at is not None and a.began_at <= at]
        return held[-1] if held else None

    def lane_at(self, at: datetime) -> int:
        a = self.attempt_at(at)
        return 0 if a is None else self.lane(a)

    def until(self, a: TimelineAttempt) -> datetime:
        """Where the attempt's bar ends: its end, else now (or the run's end)."""
        return a.ended_at or self.t.finished_at or self.t.read_at


def _holder(a: TimelineAttempt) -> str:
    return f"worker {a.holder}" if a.holder else "worker not recorded"


# Each mark's style, shared by the picture and its legend.
STYLES: dict[str, dict[str, Any]] = {
    "claim": {"marker": ">", "color": "black", "markersize": 7},
    "kill": {"marker": "^", "color": KILL, "markersize": 11},
    "loss": {"marker": "X", "color": LOSS, "markersize": 10, "markeredgecolor": "white"},
    "resume": {"marker": "D", "color": "#1F3B73", "markersize": 8},
    "answer": {
        "marker": "*",
        "color": ANSWER,
        "markersize": 15,
        "markeredgecolor": "black",
        "markeredgewidth": 0.5,
    },
    "failed": {"marker": "X", "color": "black", "markersize": 9},
    "pause": {"marker": "|", "color": "black", "markersize": 16, "markeredgewidth": 2},
}
LABELS = {
    "claim": "claimed by a worker",
    "silent": "no record until the loss was seen",
    "kill": "worker killed (harness)",
    "loss": "loss seen, run claimed (by whom: beside the line)",
    "resume": "resumed",
    "answer": "answer stored",
    "failed": "failed",
    "pause": "handed back, or waits",
}
_ENDS = {"agent.run.failed": "failed", "agent.run.error": "error", "agent.run.stopped": "stopped"}
_PAUSES = {"agent.run.handed_back": "handed back", "agent.run.waiting": "waits"}


def draw(t: Timeline, kills: Sequence[KillMark] = ()) -> Figure:
    """The run's timeline as a matplotlib figure (no pyplot, no global state)."""
    lay = _Layout(t)
    fig = Figure(figsize=(10, 1.5 + 0.7 * (len(lay.lanes) + lay.below)), dpi=110)
    p = _Painter(fig.add_subplot(), lay)
    p.queue()
    for a in t.attempts:
        p.attempt(a)
    for call in t.calls:
        p.call(call)
    for e in t.events:
        p.event(e)
    for k in kills:
        p.kill(k)
    p.answer()
    p.axes()
    lines = _title_lines(fig, _title_parts(t))
    # Each line of the title takes its own room above the axes, so the lanes keep theirs.
    fig.set_figheight(fig.get_figheight() + TITLE_LINE_IN * (len(lines) - 1))
    height = fig.get_figheight()
    fig.text(
        TITLE_X,
        1 - 0.1 / height,
        "\n".join(lines),
        fontsize=TITLE_SIZE,
        ha="left",
        va="top",
        gid="title",
    )
    rows = _legend(fig, p.seen)
    top = 1 - (0.22 + TITLE_LINE_IN * len(lines)) / height
    fig.subplots_adjust(left=0.2, right=0.98, top=top, bottom=(0.75 + 0.17 * rows) / height)
    return fig


# The title: at the figure's left edge (not the axes', which leaves room for the lanes' names),
# in lines that each fit the figure's width, measured by the renderer that draws it.
TITLE_X = 0.01
TITLE_SIZE = 10
TITLE_LINE_IN = 0.2
SEPARATOR = " · "


def _title_parts(t: Timeline) -> list[str]:
    """What the title says, in pieces that may go on separate lines."""
    lost = {0: "never lost", 1: "lost once"}.get(t.lost_count, f"lost {t.lost_count} times")
    n = len(t.attempts)
    return [f"run {t.run_id}", t.agent, t.status, f"{n} attempt{'' if n == 1 else 's'}, {lost}"]


def _title_lines(fig: Figure, parts: list[str]) -> list[str]:
    """The parts joined into as few lines as fit the figure's width; a part too long for a
    line of its own is cut short with an ellipsis."""
    renderer = FigureCanvasAgg(fig).get_renderer()  # type: ignore[no-untyped-call]
    room = fig.bbox.width * (1 - 2 * TITLE_X)
    probe = Text(fontsize=TITLE_SIZE, figure=fig)

    def fits(text: str) -> bool:
        probe.set_text(text)
        return bool(probe.get_window_extent(renderer).width <= room)

    lines: list[str] = []
    for part in parts:
        while not fits(part) and len(part) > 1:
            part = part[:-2] + "…"
        if lines and fits(lines[-1] + SEPARATOR + part):
            lines[-1] += SEPARATOR + part
        else:
            lines.append(part)
    return lines


class _Painter:
    """Draws one timeline's parts on one axes, noting which kinds of mark it used (for the
    legend)."""

    def __init__(self, ax: Axes, lay: _Layout) -> None:
        self.ax, self.lay = ax, lay
        self.seen: set[str] = set()

    def mark(self, style: str, x: float, y: float, gid: str | None = None, z: float = 5) -> None:
        self.ax.plot([x], [y], linestyle="", gid=gid, zorder=z, **STYLES[style])
        self.seen.add(style)

    def note(self, text: str, xy: tuple[float, float], dx: float, dy: float, **kw: Any) -> None:
        """A label `dx`, `dy` points from a place in data coordinates."""
        kw.setdefault("fontsize", 8)
        self.ax.annotate(text, xy, xytext=(dx, dy), textcoords="offset points", **kw)

    def queue(self) -> None:
        """The stretches with no worker: queued before the first claim, between attempts."""
        lay, gaps = self.lay, []
        previous: datetime | None = lay.origin
        for a in lay.t.attempts:
            if previous is not None and a.began_at is not None and a.began_at > previous:
                gaps.append((lay.x(previous), lay.x(a.began_at) - lay.x(previous)))
            previous = a.ended_at
        if previous is not None and lay.t.status in ("queued", "waiting"):
            gaps.append((lay.x(previous), lay.x(lay.t.read_at) - lay.x(previous)))
        self.ax.broken_barh(gaps, (-0.12, 0.24), color=QUEUE, gid="queue")

    def attempt(self, a: TimelineAttempt) -> None:
        """An attempt's bar, hatched after its last record when it was lost; its claim."""
        if a.began_at is None:
            return
        lay, y, start = self.lay, self.lay.lane(a), self.lay.x(a.began_at)
        lost = a.end == "lost" and a.ended_at is not None
        # A lost attempt is solid up to its last record (none: its claim), then hatched.
        solid = lay.x((a.last_record_at or a.began_at) if lost else lay.until(a))
        self.ax.broken_barh(
            [(start, max(solid - start, 0.0))],
            (y - 0.25, 0.5),
            facecolor=BAR,
            edgecolor=BAR_EDGE,
            gid=f"attempt-{a.attempt}",
        )
        if lost:
            self.ax.broken_barh(
                [(solid, lay.x(lay.until(a)) - solid)],
                (y - 0.25, 0.5),
                facecolor="white",
                edgecolor=LOSS,
                hatch="///",
                linewidth=0.6,
            )
            self.seen.add("silent")
        self.note(
            f"attempt {a.attempt}", (start, y), -7, 0, va="center", ha="right", color=BAR_EDGE
        )
        if a.claimed_at is not None:
            self.mark("claim", start, y, gid=f"claim-{a.attempt}")

    def call(self, c: TimelineCall) -> None:
        """A marked call: hollow where marked, filled where settled, joined by a line."""
        lay, outcome = self.lay, c.outcome
        self.seen.add(f"call:{outcome}")
        # Calls of one step sit side by side: stagger them so they stay apart.
        dy = -0.08 if c.call_index % 2 == 0 else 0.08
        x0, y0 = lay.x(c.marked_at), lay.lane_at(c.marked_at) + dy
        edge = "black" if outcome == "in_doubt" else colour(outcome)
        gid = f"call-{c.step}-{c.call_index}"
        self.ax.plot(
            [x0],
            [y0],
            marker="o",
            markersize=7,
            markerfacecolor="white",
            markeredgecolor=edge,
            markeredgewidth=1.5,
            gid=gid,
            zorder=4,
        )
        # Steep, so calls a few pixels apart keep their names apart; only one lane holds the
        # run at a time, so the names may rise into the (idle) lane above.
        self.note(
            c.tool,
            (x0, y0),
            1,
            6,
            fontsize=7,
            rotation=55,
            rotation_mode="anchor",
            color="#333333",
            zorder=6,
        )
        if c.settled_at is None:
            return
        x1, y1 = lay.x(c.settled_at), lay.lane_at(c.settled_at) + dy
        self.ax.plot(
            [x0, x1],
            [y0, y1],
            linestyle="-" if y1 == y0 else ":",
            color=edge,
            linewidth=1.2,
            zorder=3,
        )
        self.ax.plot(
            [x1],
            [y1],
            marker="o",
            markersize=7,
            color=colour(outcome),
            zorder=4,
            markeredgecolor="black",
            markeredgewidth=0.5,
            gid=f"{gid}-settled",
        )

    def event(self, e: TimelineEvent) -> None:
        """Losses, resumes, ends and pauses (a settled call is drawn as its call)."""
        x, y = self.lay.x(e.at), self.lay.lane_at(e.at)
        if e.is_loss:
            self.loss(e)
        elif e.is_resume:
            self.resume(e)
        elif e.kind in _ENDS:
            word = _ENDS[e.kind]
            self.mark("failed", x, y, gid=f"{word}-{e.attempt}")
            self.note(f"{word}: {e.code}" if e.code else word, (x, y), 4, -16)
        elif e.kind in _PAUSES:
            self.mark("pause", x, y)
            self.note(_PAUSES[e.kind], (x, y), 3, -16)

    def loss(self, e: TimelineEvent) -> None:
        """The attempt's loss was seen (its worker died, or its lease lapsed) and the run
        claimed, by whoever the claim's audit names (store/timeline.py `claimer`)."""
        lay, x = self.lay, self.lay.x(e.at)
        lost = next((a for a in lay.t.attempts if a.attempt == e.attempt), None)
        y = lay.lane(lost) if lost is not None and lost.began_at is not None else 0
        self.ax.axvline(x, color=LOSS, linestyle="--", linewidth=1.2, gid=f"loss-{e.attempt}")
        self.mark("loss", x, y)
        how = f" ({e.seen.replace('_', ' ')})" if e.seen else ""
        then = "failed the run" if e.kind == "agent.run.failed" else "requeued the run"
        # The words go to whichever side of the line has more room on the axes.
        low, high = lay.xlim()
        right = x - low > high - x
        # Losses close in time take turns above the queue lane, so their words stay apart.
        row = -0.62 + 0.22 * (lay.t.losses.index(e) % 2)
        self.note(
            f"attempt {e.attempt} lost{how}: {e.claimer} {then}",
            (x, row),
            -4 if right else 4,
            0,
            color=LOSS,
            va="center",
            ha="right" if right else "left",
        )

    def resume(self, e: TimelineEvent) -> None:
        """A resume: a diamond, and each call it took up as a square coloured by how."""
        x, y = self.lay.x(e.at), self.lay.lane_at(e.at)
        self.mark("resume", x, y, gid=f"resume-{e.attempt}", z=2.5)
        # Near the right edge the words go left of the squares, so they stay on the picture.
        left = x > 0.75 * self.lay.end
        for i, call in enumerate(e.calls):
            self.seen.add(f"call:{call.settled}")
            self.note(
                f"{call.tool}: {call.settled}",
                (x, y),
                -6 if left else 6,
                -16 - 10 * i,
                fontsize=7,
                va="center",
                ha="right" if left else "left",
                bbox={"boxstyle": "square,pad=0.15", "facecolor": "white", "edgecolor": "none"},
            )
            self.note(
                "■", (x, y), 0, -16 - 10 * i, va="center", ha="center", color=colour(call.settled)
            )

    def kill(self, k: KillMark) -> None:
        """The harness's own kill of the worker holding the run."""
        x, y = self.lay.x(k.at), self.lay.lane_at(k.at)
        # Below the bar, pointing up at the moment: the calls' labels are above it.
        self.mark("kill", x, y + 0.36, gid="kill")
        self.note(k.label, (x, y + 0.36), 8, 0, va="center", color=KILL, fontweight="bold")

    def answer(self) -> None:
        """The stored answer, and the run's end."""
        t, lay = self.lay.t, self.lay
        if t.answered_at is not None:
            self.mark("answer", lay.x(t.answered_at), lay.lane_at(t.answered_at), gid="answer")
        if t.finished_at is not None:
            xy = (lay.x(t.finished_at), lay.lane_at(t.finished_at))
            self.note(t.status, xy, 8, 0, fontsize=9, va="center", fontweight="bold")

    def axes(self) -> None:
        lay, ax = self.lay, self.ax
        ax.set_yticks(range(len(lay.lanes)), lay.lanes, fontsize=9)
        ax.set_ylim(len(lay.lanes) - 1 + lay.below, -0.75)
        ax.set_xlim(*lay.xlim())
        ax.set_xlabel("seconds since the run was created (database clock)")
        ax.grid(axis="x", color="#EEEEEE")
        ax.set_axisbelow(True)


def _legend(fig: Figure, seen: set[str]) -> int:
    """The marks, then the settlement colours, this picture shows; returns its rows."""
    handles: list[Artist] = []
    for key, label in LABELS.items():
        if key == "silent" and key in seen:
            handles.append(Patch(facecolor="white", edgecolor=LOSS, hatch="///", label=label))
        elif key in seen:
            # The loss is a dashed line across the picture as well as a mark.
            line: dict[str, Any] = {"linestyle": "--" if key == "loss" else ""}
            handles.append(Line2D([], [], label=label, **line, **STYLES[key]))
    order = list(SETTLEMENT_COLOURS)
    outcomes = sorted(
        (s[5:] for s in seen if s.startswith("call:")),
        key=lambda s: (order.index(s) if s in order else len(order), s),
    )
    for outcome in outcomes:
        handles.append(
            Line2D(
                [],
                [],
                marker="o",
                linestyle="",
                markerfacecolor=colour(outcome),
                markeredgecolor="black",
                markeredgewidth=0.5,
                label=SETTLEMENT_MEANING.get(outcome, outcome),
            )
        )
    fig.legend(
        handles=handles,
        loc="lower center",
        ncol=3,
        fontsize=8,
        frameon=False,
        title="circle: a marked call (hollow: marked; filled: settled, by colour); "
        "square: how a resume took a call up",
        title_fontsize=8,
    )
    return -(-len(handles) // 3)


def png_bytes(t: Timeline, kills: Sequence[KillMark] = ()) -> bytes:
    """The picture as PNG bytes."""
    buf = io.BytesIO()
    draw(t, kills).savefig(buf, format="png")
    return buf.getvalue()


def svg(t: Timeline, kills: Sequence[KillMark] = ()) -> str:
    """The picture as an inline <svg> element (text kept as text), its ids made unique to
    the run so several can share one page."""
    buf = io.StringIO()
    with matplotlib.rc_context({"svg.fonttype": "none", "svg.hashsalt": t.run_id}):
        draw(t, kills).savefig(buf, format="svg")
    text = buf.getvalue()
    text = text[text.index("<svg") :]
    prefix = f"r{t.run_id[:8]}-"
    text = re.sub(r'\bid="', f'id="{prefix}', text)
    text = re.sub(r'(href="#|url\(#)', rf"\g<1>{prefix}", text)
    return text.replace("<svg ", '<svg style="max-width:100%;height:auto" ', 1)


def write_png(path: Path, t: Timeline, kills: Sequence[KillMark] = ()) -> Path:
    """One run's timeline as a PNG at `path`."""
    path.write_bytes(png_bytes(t, kills))
    return path
