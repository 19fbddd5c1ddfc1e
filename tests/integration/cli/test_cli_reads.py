"""`liyagent status` and `liyagent inspect`, the commands an operator types all day, read what
Postgres records with the database and the seal keys alone: they import no Celery, no Redis
client, no tool module, no framework, no plotting (tests/support/imports.py says how that is
seen), and still answer in full."""

from __future__ import annotations

import json
import subprocess
import sys

from liyagent.local.procs import ROOT
from tests.support.imports import HEAVY, imported, tops
from tests.support.scripts import mixed

# Beyond the heavy libraries: what a read of Postgres has no use for.
NOT_FOR_A_READ = HEAVY | {"redis", "pydantic", "httpx", "tasks", "front", "simulators"}


def _json(stack, *args: str) -> object:
    done = subprocess.run(
        [sys.executable, "-m", "liyagent", *args, "--json"],
        cwd=ROOT,
        env=stack.env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_status_reads_postgres_only(stack) -> None:
    run_id = stack.start(mixed("s"))
    assert _json(stack, "status", run_id[:8])["run_id"] == run_id  # type: ignore[index]
    assert run_id in [r["id"] for r in _json(stack, "status")]  # type: ignore[union-attr]
    for args in (["status"], ["status", run_id[:8]]):
        found = imported(*args, env=stack.env)
        assert tops(found) & NOT_FOR_A_READ == set(), args
        assert "sqlalchemy.orm" not in found and "runtime.services" not in found


def test_inspect_reads_postgres_only(stack) -> None:
    run_id = stack.start(mixed("i"))
    report = _json(stack, "inspect", run_id)
    assert report["run"]["id"] == run_id  # type: ignore[index]
    found = imported("inspect", run_id, env=stack.env)
    assert tops(found) & NOT_FOR_A_READ == set()
    assert "sqlalchemy.orm" not in found and "runtime.services" not in found
