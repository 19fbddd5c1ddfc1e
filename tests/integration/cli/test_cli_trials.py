"""`liyagent trials --json` end to end, as an operator starts it: a clean environment (no
LIYAGENT_* settings), so it finds the machine's Postgres and Redis itself; its database gets a
name of this test's own. Recovery times are reported by the command, not asserted here."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
import redis

from liyagent.local.procs import ROOT, alive_in_groups
from store.admin import drop_database


@pytest.mark.kill
@pytest.mark.timeout(330)
def test_trials_command_reports_no_loss_and_cleans_up(servers, tmp_path: Path) -> None:
    database = f"liyagent_trials_test_{uuid.uuid4().hex[:10]}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("LIYAGENT_")}
    env["LIYAGENT_TRIALS_DATABASE"] = database
    report = tmp_path / "r.json"
    try:
        done = subprocess.run(
            [sys.executable, "-m", "liyagent.cli.main", "trials", "--trials", "6", "--json",
             "--report", str(report)],
            env=env, cwd=ROOT, capture_output=True, text=True, timeout=300,
        )  # fmt: skip
    finally:
        drop_database(servers[0], database)
    assert done.returncode == 0, done.stderr[-4000:]
    result = json.loads(done.stdout)  # exactly one JSON object on stdout

    assert result["trials"] == 6
    assert result["lost"] == 0, result["lost_trials"]
    assert result["duplicate_writes"] == 0, result["duplicate_writes_by_vendor"]
    assert result["stale_writes"] == 0, result["stale_write_detail"]
    assert isinstance(result["seed"], int)
    assert Path(result["report"]) == report and report.is_file()
    assert json.loads(report.read_text())["seed"] == result["seed"]
    png = Path(result["histogram"])
    assert png == report.with_suffix(".png") and png.read_bytes()[:4] == b"\x89PNG"

    assert len(result["pids"]) >= 8  # simulator, survivor, beat, front, victims and pools
    assert alive_in_groups(result["pids"]) == []
    client = redis.Redis.from_url(servers[1])
    assert list(client.scan_iter(match=f"{result['namespace']}*")) == []
    client.close()
