"""Real subprocesses for tests: each in its own session, so a kill takes its whole group."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from types import FrameType

ROOT = Path(__file__).resolve().parents[2]  # the repository (the processes' cwd)


class Proc:
    """A process group started for a test, with its combined output in a log file."""

    def __init__(
        self, name: str, argv: list[str], env: dict[str, str], log: Path, cwd: Path = ROOT
    ) -> None:
        """Start `argv` in `cwd` (the repository unless said: a team's own directory)."""
        self.name = name
        self.log = log
        self._fh = open(log, "ab")  # noqa: SIM115 - open as long as the process runs
        self.popen = subprocess.Popen(
            argv,
            cwd=cwd,
            env=env,
            stdout=self._fh,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.pgid = self.popen.pid

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def wait_for(self, pattern: str, timeout: float = 30.0) -> re.Match[str]:
        """Wait until the log matches `pattern`; fail with the log's tail if it never does."""
        rx = re.compile(pattern)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = rx.search(self.output())
            if found:
                return found
            if self.popen.poll() is not None:
                break
            time.sleep(0.05)
        raise AssertionError(
            f"{self.name}: {pattern!r} not seen within {timeout}s "
            f"(exit {self.popen.poll()}); log tail:\n{self.output()[-3000:]}"
        )

    def signal_group(self, sig: signal.Signals) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.pgid, sig)

    def kill(self) -> None:
        """SIGKILL the whole group, as a dead machine would, and reap it."""
        self.signal_group(signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.popen.wait(timeout=10)
        self._fh.close()

    def stop(self, grace_s: float = 10.0) -> None:
        """SIGTERM the whole group so it shuts down cleanly; SIGKILL it if it outlives grace_s."""
        self.ask_to_stop()
        self.stopped_by(time.monotonic() + grace_s)

    def ask_to_stop(self) -> None:
        """SIGTERM the whole group (a clean shutdown), without waiting for it."""
        if self.popen.poll() is None:
            self.signal_group(signal.SIGTERM)

    def stopped_by(self, deadline: float) -> None:
        """Wait for a group asked to stop until `deadline` (monotonic), then SIGKILL what is
        left of it (also any child the leader left behind)."""
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.popen.wait(timeout=max(0.0, deadline - time.monotonic()))
        self.kill()

    def alive(self) -> bool:
        return self.popen.poll() is None

    def children(self) -> list[int]:
        """Pids of the process's direct children (a prefork worker's pool)."""
        path = Path(f"/proc/{self.popen.pid}/task/{self.popen.pid}/children")
        try:
            return [int(p) for p in path.read_text().split()]
        except OSError:
            return []


def python(*args: str) -> list[str]:
    return [sys.executable, *args]


@contextlib.contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """Treat SIGTERM like Ctrl-C, so a command's clean-up runs either way."""

    def handler(_sig: int, _frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def alive_in_groups(pids: list[int]) -> list[int]:
    """Which of these pids still run in a process group led by one of them (so a process that
    merely reused a pid is not counted): what a clean stop must leave empty."""
    alive = []
    for pid in pids:
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            continue
        if int(stat.rsplit(")", 1)[1].split()[2]) in pids:
            alive.append(pid)
    return alive
