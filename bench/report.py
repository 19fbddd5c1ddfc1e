"""What a section hands back (figures with their targets), and how the bench shows them: a rich
table per section with PASS/MISS beside each target, one JSON file with everything, and one PNG
chart of the main figures (matplotlib)."""

from __future__ import annotations

import json
import math
import os
import platform
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from liyagent.local.procs import ROOT


def quantile(samples: Sequence[float], q: float) -> float | None:
    """The nearest-rank quantile (as the trials' verdict computes it); None without samples."""
    if not samples:
        return None
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


@dataclass(frozen=True)
class Target:
    """A bound a figure must keep: `op` is "<=" or ">="."""

    op: str
    bound: float
    source: str = "issue 12"

    def met(self, value: float) -> bool:
        return value <= self.bound if self.op == "<=" else value >= self.bound

    def __str__(self) -> str:
        return f"{self.op} {self.bound:g}"


@dataclass
class Figure:
    """One measured figure; `value` None means not measured (`note` says why)."""

    key: str
    label: str
    value: float | None
    unit: str = ""
    target: Target | None = None
    digits: int = 2
    note: str = ""
    # Kept in the JSON and the chart, left out of the printed table (a matrix shows it).
    hidden: bool = False

    @property
    def verdict(self) -> str:
        if self.target is None:
            return "-"
        if self.value is None or math.isnan(self.value):
            return "n/a"
        return "PASS" if self.target.met(self.value) else "MISS"

    def shown(self) -> str:
        if self.value is None or math.isnan(self.value):
            return self.note or "not measured"
        text = f"{self.value:.{self.digits}f}"
        return f"{text} {self.unit}".strip()

    def to_json(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "label": self.label,
            "value": None if self.value is None or math.isnan(self.value) else self.value,
            "unit": self.unit,
            "target": None if self.target is None else asdict(self.target),
            "verdict": self.verdict,
            "note": self.note,
        }


@dataclass
class Section:
    """What one section measured: its figures, an optional matrix to show, and the detail
    (samples, method, settings) that goes to the JSON only."""

    key: str
    title: str
    figures: list[Figure] = field(default_factory=list)
    matrix: tuple[list[str], list[list[str]]] | None = None
    detail: dict[str, Any] = field(default_factory=dict)
    error: str | None = None
    seconds: float = 0.0

    def figure(self, key: str) -> Figure | None:
        return next((f for f in self.figures if f.key == key), None)

    def value(self, key: str) -> float | None:
        found = self.figure(key)
        return None if found is None else found.value

    def to_json(self) -> dict[str, Any]:
        return {
            "title": self.title,
            "figures": {f.key: f.to_json() for f in self.figures},
            "matrix": None
            if self.matrix is None
            else {"columns": self.matrix[0], "rows": self.matrix[1]},
            "detail": self.detail,
            "error": self.error,
            "seconds": round(self.seconds, 1),
        }


def console() -> Console:
    return Console(highlight=False, width=max(130, Console().width))


def print_section(out: Console, section: Section) -> None:
    """The section's matrix (if any) and its figures against their targets."""
    out.rule(f"[bold]{section.title}[/]  ({section.seconds:.0f} s)")
    if section.error:
        out.print(f"[bold red]not measured:[/] {section.error}")
    if section.matrix is not None:
        columns, rows = section.matrix
        table = Table()
        for i, name in enumerate(columns):
            table.add_column(name, justify="left" if i == 0 else "right")
        for row in rows:
            table.add_row(*row)
        out.print(table)
    if section.figures:
        table = Table()
        for name in ("figure", "measured", "target", "result"):
            table.add_column(name, justify="left" if name == "figure" else "right")
        for f in (f for f in section.figures if not f.hidden):
            mark = {"PASS": "[green]PASS[/]", "MISS": "[red]MISS[/]"}.get(f.verdict, f.verdict)
            table.add_row(
                f.label,
                f.shown(),
                "-" if f.target is None else f"{f.target} {f.unit}".strip(),
                mark,
            )
        out.print(table)


def print_summary(out: Console, sections: Sequence[Section]) -> None:
    """Every targeted figure of the run, one line each."""
    table = Table(title="Targets (issue 12 and issue 11)")
    for name in ("section", "figure", "measured", "target", "result"):
        table.add_column(name, justify="left" if name in ("section", "figure") else "right")
    for s in sections:
        for f in s.figures:
            if f.target is not None:
                mark = {"PASS": "[green]PASS[/]", "MISS": "[red]MISS[/]"}.get(f.verdict, f.verdict)
                table.add_row(s.key, f.label, f.shown(), f"{f.target} {f.unit}".strip(), mark)
        if s.error:
            table.add_row(s.key, "[red]section failed[/]", s.error[:60], "-", "n/a")
    if table.row_count:
        out.print(table)


def commit_facts() -> dict[str, Any]:
    """The commit measured, and whether the tree had changes not in it."""

    def git(*args: str) -> str:
        try:
            done = subprocess.run(
                ["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=10
            )
        except (OSError, subprocess.SubprocessError):
            return ""
        return done.stdout.strip() if done.returncode == 0 else ""

    return {
        "commit": git("rev-parse", "HEAD") or None,
        "branch": git("rev-parse", "--abbrev-ref", "HEAD") or None,
        "dirty": bool(git("status", "--porcelain", "--untracked-files=no")),
    }


def load_average() -> list[float] | None:
    """The 1, 5 and 15 minute load averages (a shared machine's noise), if the OS says."""
    return [round(x, 2) for x in os.getloadavg()] if hasattr(os, "getloadavg") else None


def machine_facts(
    pg_version: str | None, redis_version: str | None, load_at_start: list[float] | None
) -> dict[str, Any]:
    return {
        "cores": os.cpu_count(),
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "postgres": pg_version,
        "redis": redis_version,
        "load_average_at_start": load_at_start,
        "load_average_at_end": load_average(),
    }


def write_json(path: Path, body: dict[str, Any]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(body, indent=2, default=str) + "\n")
    return path


def _bars(
    ax: Any,
    labels: list[str],
    values: list[float | None],
    title: str,
    unit: str,
    target: Target | None = None,
) -> None:
    shown = [0.0 if v is None else v for v in values]
    colors = ["#4c72b0" if i % 2 == 0 else "#dd8452" for i in range(len(labels))]
    bars = ax.bar(labels, shown, color=colors)
    for bar, v in zip(bars, values, strict=True):
        ax.annotate(
            "n/a" if v is None else f"{v:.3g}",
            (bar.get_x() + bar.get_width() / 2, bar.get_height()),
            ha="center",
            va="bottom",
            fontsize=8,
        )
    if target is not None:
        ax.axhline(target.bound, color="red", linestyle="--", linewidth=1, label=f"target {target}")
        ax.legend(fontsize=7, loc="upper right")
    ax.set_title(title, fontsize=9)
    ax.set_ylabel(unit, fontsize=8)
    ax.tick_params(axis="x", labelsize=7, rotation=20)
    ax.tick_params(axis="y", labelsize=7)


def write_chart(path: Path, sections: dict[str, Section], header: str) -> Path:
    """One PNG with the main figures of every section that ran (a panel each)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 3, figsize=(15, 8.5))
    panels = iter(axes.flat)
    t = sections.get("throughput")
    if t is not None:
        ax = next(panels)
        keys = [
            "ours_0ms_runs_per_s",
            "base_0ms_runs_per_s",
            "ours_50ms_runs_per_s",
            "base_50ms_runs_per_s",
        ]
        _bars(
            ax,
            ["liyagent 0 ms", "Celery 0 ms", "liyagent 50 ms", "Celery 50 ms"],
            [t.value(k) for k in keys],
            "Throughput (one worker, -c 2)",
            "runs/s",
        )
        ax = next(panels)
        keys = ["added_p50_ms_per_step_0ms", "added_p50_ms_per_step_50ms"]
        f = t.figure(keys[0])
        _bars(
            ax,
            ["0 ms model", "50 ms model"],
            [t.value(k) for k in keys],
            "Added p50 latency per model step",
            "ms",
            f.target if f else None,
        )
    c = sections.get("counts")
    if c is not None:
        ax = next(panels)
        rows = ["read_step", "write_step", "run_step"]
        metrics = [
            ("transactions", "xacts"),
            ("write_statements", "write stmts"),
            ("row_writes", "row writes"),
            ("pg_round_trips", "PG trips"),
            ("redis_round_trips", "Redis trips"),
        ]
        width = 0.25
        for i, row in enumerate(rows):
            vals = [c.value(f"{row}_{m}") or 0.0 for m, _ in metrics]
            ax.bar(
                [x + i * width for x in range(len(metrics))],
                vals,
                width,
                label={
                    "read_step": "read-only step",
                    "write_step": "step with one write",
                    "run_step": "5-step run / 5",
                }[row],
            )
        ax.set_xticks(
            [x + width for x in range(len(metrics))], [name for _, name in metrics], fontsize=7
        )
        ax.set_title("Server-counted work per model step", fontsize=9)
        ax.legend(fontsize=7)
        ax.tick_params(axis="y", labelsize=7)
    s = sections.get("scaling")
    if s is not None:
        ax = next(panels)
        f = s.figure("ratio")
        _bars(
            ax,
            ["1 process", "2 processes"],
            [s.value("one_runs_per_s"), s.value("two_runs_per_s")],
            f"Scaling at 50 ms (ratio {s.value('ratio') or 0:.2f}, target >= 1.8)",
            "runs/s",
        )
    w = sections.get("sweeps")
    if w is not None:
        ax = next(panels)
        sweeps = [f for f in w.figures if f.key.startswith("sweep_p99_")]
        labels = [f.label.removeprefix("sweep p99, ") for f in sweeps]
        target = next((f.target for f in sweeps if f.target), None)
        _bars(ax, labels, [f.value for f in sweeps], "Sweep p99 (index path)", "ms", target)
    r = sections.get("recovery")
    if r is not None:
        ax = next(panels)
        keys = ["resume_p50_s", "end_p50_s", "end_p95_s", "end_max_s"]
        _bars(
            ax,
            ["resume p50", "end p50", "end p95", "end max"],
            [r.value(k) for k in keys],
            "Recovery after SIGKILL (targets 2/4/6/15 s)",
            "s",
        )
    for ax in panels:
        ax.axis("off")
    fig.suptitle(header, fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
