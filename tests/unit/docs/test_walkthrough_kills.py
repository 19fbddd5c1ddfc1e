"""The walkthroughs' worker kills take one worker down, by its pid, never every worker on the
host by name: each shown kill is run, as written, against a stand-in worker (a main process
and its pool child) beside a bystander whose command line reads like any other worker's. Every
page we publish (the README, the docs site's pages, the example apps' READMEs) is held to it;
the walkthroughs (the five minutes of docs/start.md, the order desk's) must show their kill."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
# The walkthroughs that SIGKILL a worker mid-run.
WALKTHROUGHS = [ROOT / "docs" / "start.md", ROOT / "examples" / "order_desk" / "README.md"]
# Every page a reader may copy a command from.
DOCS = sorted(
    {ROOT / "README.md", *(ROOT / "docs").rglob("*.md"), *(ROOT / "examples").glob("*/README.md")}
)
# Any kill by name: pkill or killall, whatever the pattern or the signal.
BY_NAME = re.compile(r"\b(pkill|killall)\b")
# A worker started any way the docs show it: `liyagent worker`, `celery -A liyagent.worker
# worker` or `celery -A tasks worker`.
PIDFILE = re.compile(
    r"(?:liyagent|celery -A (?:liyagent\.worker|tasks)) worker\b[^\n]*--pidfile[= ](\S+)"
)

# A stand-in worker: a main process that forks a pool child and waits on it.
WORKER = "import os, time\nif os.fork() == 0:\n    time.sleep(60)\nelse:\n    time.sleep(60)\n"


def _shell_blocks(text: str) -> list[str]:
    return re.findall(r"```(?:bash|sh|shell)\n(.*?)```", text, re.S)


def _kills(path: Path) -> list[tuple[str, str]]:
    """Each `kill -9` line of the file's shell blocks, with the pidfile (written by a worker
    the file starts) that it reads."""
    blocks = _shell_blocks(path.read_text())
    pidfiles = [f for block in blocks for f in PIDFILE.findall(block)]
    found = []
    for line in (ln for block in blocks for ln in block.splitlines()):
        if "kill -9" in line:
            named = [f for f in pidfiles if f in line]
            assert named, f"{path.name}: {line!r} reads no pidfile of a worker it started"
            command = re.sub(r"^sleep \d+;\s*", "", line.split("#", 1)[0]).strip()
            found.append((command, named[0]))
    return found


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] != "Z"
    except FileNotFoundError:
        return False


def _children(pid: int, timeout: float = 10) -> list[int]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        kids = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout
        if kids.split():
            return [int(k) for k in kids.split()]
        time.sleep(0.05)
    raise AssertionError(f"process {pid} never forked its child")


@pytest.mark.parametrize("path", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_page_kills_workers_by_name(path: Path) -> None:
    for block in _shell_blocks(path.read_text()):
        for line in block.splitlines():
            assert not BY_NAME.search(line), f"{path.name} kills by name: {line!r}"


@pytest.mark.parametrize("path", WALKTHROUGHS, ids=lambda p: str(p.relative_to(ROOT)))
def test_each_walkthrough_shows_its_worker_kill(path: Path) -> None:
    assert _kills(path), f"{path.name} shows no worker kill"


@pytest.mark.parametrize("path", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_the_shown_kill_takes_down_that_worker_and_its_pool_only(
    path: Path, tmp_path: Path
) -> None:
    for line in (ln for b in _shell_blocks(path.read_text()) for ln in b.splitlines()):
        if BY_NAME.search(line):
            pytest.fail(f"{path.name} kills by name (not run here: it would hit every worker)")
    for command, pidfile in _kills(path):
        worker = subprocess.Popen([sys.executable, "-c", WORKER])
        # Reads like a worker to a name match; a kill by pid must leave it alone.
        bystander = subprocess.Popen(["bash", "-c", 'exec -a "celery -A tasks worker" sleep 60'])
        try:
            (child,) = _children(worker.pid)
            mine = tmp_path / "w.pid"
            mine.write_text(f"{worker.pid}\n")
            done = subprocess.run(
                ["bash", "-c", command.replace(pidfile, str(mine))],
                capture_output=True,
                text=True,
                timeout=30,
            )
            assert done.returncode == 0, done.stderr
            assert worker.wait(timeout=10) == -signal.SIGKILL
            deadline = time.monotonic() + 10
            while _alive(child):
                assert time.monotonic() < deadline, f"{command!r} left the pool child alive"
                time.sleep(0.05)
            assert bystander.poll() is None, f"{command!r} killed another worker"
        finally:
            for proc in (worker, bystander):
                if proc.poll() is None:
                    proc.kill()
                proc.wait(timeout=10)
            if "child" in locals() and _alive(child):
                os.kill(child, signal.SIGKILL)
