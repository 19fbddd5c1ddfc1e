"""`liyagent demo --json` end to end: a real worker SIGKILLed, every run resumed, no duplicate.

The demo runs as a user would start it, with a clean environment (no LIYAGENT_* settings), so
it finds the machine's Postgres and Redis itself; its database gets a name of this test's own.
Its Teams turns (Bot Framework activities) and webhook call go through the app front it starts;
the Teams replies are counted here again from the Bot Connector simulator's own records, before
the database is dropped.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import stat
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import redis
import sqlalchemy as sa

from liyagent.local.backends import MACHINE_PG_ADMIN
from liyagent.local.procs import ROOT, alive_in_groups
from liyagent.local.servers import reachable


def _teams_replies(admin_engine: sa.Engine, database: str) -> dict[str, int]:
    """Teams replies per key in the Bot Connector's records of the demo's database."""
    engine = sa.create_engine(admin_engine.url.set(database=database), hide_parameters=True)
    try:
        with engine.connect() as conn:
            rows = conn.execute(
                sa.text(
                    "SELECT idem_key, count(*) FROM sim.connector_activities "
                    "WHERE idem_key LIKE 'lya-teams-reply-%' GROUP BY idem_key"
                )
            ).all()
    finally:
        engine.dispose()
    return {str(key): int(n) for key, n in rows}


def _stopped(url: str) -> bool:
    """Nothing answers at `url` any more."""
    try:
        httpx.get(url, timeout=2)
    except httpx.TransportError:
        return True
    return False


@pytest.fixture
def machine_admin() -> Iterator[sa.Engine]:
    """The machine's Postgres, which the demo finds by itself (not the test process's own)."""
    if not reachable("127.0.0.1", 5432):
        pytest.fail("the demo test needs the machine's Postgres on 127.0.0.1:5432")
    engine = sa.create_engine(MACHINE_PG_ADMIN, isolation_level="AUTOCOMMIT", hide_parameters=True)
    yield engine
    engine.dispose()


@pytest.mark.kill
@pytest.mark.timeout(300)
def test_demo_resumes_every_run_without_duplicates(machine_admin, servers, tmp_path) -> None:
    admin_engine = machine_admin
    database = f"liyagent_demo_test_{uuid.uuid4().hex[:10]}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("LIYAGENT_")}
    env["LIYAGENT_DEMO_DATABASE"] = database
    try:
        done = subprocess.run(
            [sys.executable, "-m", "liyagent.cli.main", "demo", "--json", "--runs", "6",
             "--report-dir", str(tmp_path / "reports")],
            env=env, cwd=ROOT, capture_output=True, text=True, timeout=240,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr[-4000:]
        result = json.loads(done.stdout)  # exactly one JSON object on stdout
        replies = _teams_replies(admin_engine, database)
    finally:
        with admin_engine.connect() as conn:
            conn.execute(sa.text(f"DROP DATABASE IF EXISTS {database} WITH (FORCE)"))

    assert result["runs"] == 6
    assert result["succeeded"] == 6
    assert result["lost"] == 0 and result["failed"] == 0
    assert result["duplicate_writes"] == 0
    assert result["resumed"] >= 1
    assert result["killed_worker"] == "w1" and result["in_flight_at_kill"]
    assert 0 < result["recovery_s"]["max"] < 30
    assert result["recovery_s"]["p50"] <= result["recovery_s"]["max"]
    assert 0 < result["time_to_resume_s"]["p50"] <= result["recovery_s"]["max"]
    report = Path(result["report"])
    assert report.is_file() and report.parent == tmp_path / "reports"
    assert "liyagent crash-resume demo" in report.read_text()
    # Every resumed run's timeline is drawn (rendered in Chromium by test_timeline.py).
    resumed = [row["id"] for row in result["run_rows"] if row["lost_count"] > 0]
    assert resumed and all(f"id='timeline-{r}'" in report.read_text() for r in resumed)

    # Six runs cycle through triage (API), Teams, comment (API), webhook, page (API), triage.
    assert result["started_via"] == {"api": 4, "teams": 1, "webhook": 1}
    assert result["teams_turns"] == 1
    assert result["teams_replied_once"] == 1
    assert list(result["teams_replies"].values()) == [1]
    assert replies == {f"lya-teams-reply-{r}": 1 for r in result["teams_replies"]}
    assert result["duplicates_by_record"]["Teams replies"] == 0
    assert result["vendor_rows"]["Teams replies"] == 1

    # No secret in clear on the terminal: each is masked there and kept in a 0600 file.
    printed = done.stdout + done.stderr
    assert not re.search(r"Bearer [A-Za-z0-9_-]{8,}", printed), "the front token was printed"
    assert "LIYAGENT_SEAL_KEYS=" not in printed, "the seal key was printed"
    kept = Path(result["secrets_file"])
    assert kept.parent == Path(result["log_dir"]) and str(kept) in printed
    assert stat.S_IMODE(kept.stat().st_mode) == 0o600
    values = dict(line.split("=", 1) for line in kept.read_text().splitlines()[1:])
    for name in ("LIYAGENT_FRONT_TOKEN", "LIYAGENT_DEMO_FLOWER_PASSWORD", "LIYAGENT_SEAL_KEYS"):
        secret = shlex.split(values[name])[0]
        assert secret not in printed and secret[:4] in printed, name

    assert result["front_url"].startswith("http://127.0.0.1:")
    assert result["flower_url"].startswith("http://127.0.0.1:")
    assert result["flower_user"] == "demo"
    assert result["flower_checked"] is True  # 401 without its password, 200 with it
    assert _stopped(result["flower_url"]) and _stopped(result["front_url"])

    # simulator, beat, the front, Flower, two workers and their pools
    assert len(result["pids"]) >= 12
    assert alive_in_groups(result["pids"]) == []
    client = redis.Redis.from_url(servers[1])
    assert list(client.scan_iter(match=f"{result['namespace']}*")) == []
    client.close()
