"""The example app's order desk (examples/order_desk) as a test starts it: its service on a
free port over its own SQLite file, whose records judge what the agent wrote."""

from __future__ import annotations

import os
import sqlite3
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from liyagent.local.procs import ROOT, Proc, python
from tests.support.stack import Stack

ORDER_DESK = ROOT / "examples" / "order_desk"


@dataclass
class Desk:
    url: str
    db: Path
    proc: Proc

    def rows(self, sql: str, *params: object) -> list[sqlite3.Row]:
        with sqlite3.connect(self.db) as conn:
            conn.row_factory = sqlite3.Row
            return list(conn.execute(sql, params).fetchall())


def with_path(base: dict[str, str], *folders: Path) -> dict[str, str]:
    """`base` with `folders` first on its PYTHONPATH, as a team's packages would be."""
    paths = [*map(str, folders), base.get("PYTHONPATH", "")]
    return {**base, "PYTHONPATH": os.pathsep.join(paths)}


def start_desk(tmp: Path, env: dict[str, str]) -> Desk:
    """The desk service, started under `env` (its PYTHONPATH finds `order_desk`); the caller
    kills `desk.proc`."""
    db = tmp / "desk.sqlite"
    argv = python("-m", "order_desk.service", "--port", "0", "--db", str(db))
    proc = Proc("desk", argv, env, tmp / "desk.log")
    url = proc.wait_for(r"order desk listening on (\S+)", timeout=30).group(1)
    return Desk(url, db, proc)


def kill_after_the_first_write(
    stack: Stack, desk: Desk, env: dict[str, str], start: Callable[[], str], delay: float
) -> str:
    """Start the run on a victim worker, SIGKILL it `delay` seconds after the desk saw its
    first write, and leave a survivor and beat to resume it; the run's id."""
    victim = stack.worker("victim", env=env)
    run_id = start()
    deadline = time.monotonic() + 60
    while not desk.rows("SELECT 1 FROM requests WHERE method = 'POST'"):
        assert time.monotonic() < deadline, "the agent never wrote to the desk"
        time.sleep(0.02)
    time.sleep(delay)
    victim.kill()
    stack.worker("survivor", env=env)
    stack.beat()
    return run_id
