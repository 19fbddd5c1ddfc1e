"""What processes cost, read from /proc: CPU seconds (a process, its live descendants and the
children it has reaped), resident memory, and the machine's idle time, so the density section
judges a worker by what the kernel counted, not by what the worker says of itself."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

TICK = os.sysconf("SC_CLK_TCK")
PROC = Path("/proc")


def _stat(pid: int) -> list[str] | None:
    """The fields of /proc/PID/stat after the command name (None once the process is gone)."""
    try:
        raw = (PROC / str(pid) / "stat").read_text()
    except OSError:
        return None
    return raw[raw.rindex(")") + 2 :].split()


def descendants(pid: int) -> list[int]:
    """Every live process under `pid` (children, their children, ...)."""
    parents: dict[int, list[int]] = {}
    for entry in PROC.iterdir():
        if entry.name.isdigit() and (fields := _stat(int(entry.name))) is not None:
            parents.setdefault(int(fields[1]), []).append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        kids = parents.get(todo.pop(), [])
        found += kids
        todo += kids
    return found


def cpu_seconds(pid: int) -> float:
    """CPU (user + system) the process tree under `pid` has used: its own, its reaped
    children's (cutime, cstime) and its live descendants' (a prefork worker's children, a
    Postgres server's backends)."""
    total = 0.0
    for i, p in enumerate([pid, *descendants(pid)]):
        fields = _stat(p)
        if fields is None:
            continue
        # utime, stime are fields 14 and 15 of stat (11, 12 here); cutime, cstime 16, 17.
        ticks = int(fields[11]) + int(fields[12])
        if i == 0:
            ticks += int(fields[13]) + int(fields[14])
        total += ticks / TICK
    return total


def rss_mib(pid: int) -> float:
    """Resident memory of the process tree under `pid`, MiB (VmRSS summed)."""
    total_kib = 0
    for p in [pid, *descendants(pid)]:
        try:
            for line in (PROC / str(p) / "status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total_kib += int(line.split()[1])
        except OSError:
            continue
    return total_kib / 1024


@dataclass(frozen=True)
class MachineTimes:
    """The machine's CPU counters (/proc/stat's first line), in seconds summed over cores."""

    busy: float
    idle: float

    @classmethod
    def now(cls) -> MachineTimes:
        fields = [int(x) for x in (PROC / "stat").read_text().splitlines()[0].split()[1:]]
        idle = fields[3] + fields[4]  # idle + iowait
        return cls(busy=(sum(fields[:8]) - idle) / TICK, idle=idle / TICK)


def postmaster_pid(data_dir: Path) -> int:
    """A Postgres server's main process, from its data directory's postmaster.pid."""
    return int((data_dir / "postmaster.pid").read_text().splitlines()[0])
