"""A `stop` fault stops the thread that reached it at the point itself, not a little later."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

# A pool thread reaches the point and, were it not stopped there, writes a file at once: the
# file must not exist while the process is stopped.
CHILD = """
import os, sys, threading
from runtime.base import faults

def run():
    faults.point("before_send")
    with open(sys.argv[1], "w") as f:
        f.write("ran on past the point")

t = threading.Thread(target=run)
t.start()
t.join()
"""


def _stopped(pid: int) -> bool:
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat.rsplit(")", 1)[1].split()[0] == "T"


def test_a_stop_fault_stops_a_pool_thread_at_the_point(tmp_path: Path) -> None:
    for i in range(20):  # the thread used to run on in some tries out of a few
        after = tmp_path / f"after-{i}"
        env = {
            **os.environ,
            "LIYAGENT_FAULT": "before_send:stop",
            "LIYAGENT_FAULT_FILE": str(tmp_path / f"fired-{i}"),
        }
        child = subprocess.Popen([sys.executable, "-c", CHILD, str(after)], env=env)
        try:
            deadline = time.monotonic() + 10
            while not _stopped(child.pid):
                assert child.poll() is None, "the child ended without stopping"
                assert time.monotonic() < deadline, "the child never stopped"
                time.sleep(0.01)
            time.sleep(0.05)  # a thread running on would have written by now
            assert not after.exists(), f"try {i}: the thread ran on past the stop point"
            os.kill(child.pid, signal.SIGCONT)
            assert child.wait(timeout=10) == 0
            assert after.exists()
        finally:
            if child.poll() is None:
                child.kill()
