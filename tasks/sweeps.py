"""The sweep task beat fires every few seconds, and the retention pass it fires less often."""

from __future__ import annotations

from runtime.retention import run_retention
from runtime.sweeper import Sweeper
from tasks.app import app
from tasks.deliveries import unacked_runs
from tasks.services import services


@app.task(name="liyagent.sweep", ignore_result=True)
def sweep() -> dict[str, object]:
    s = services()
    return Sweeper(s, unacked_runs(s.redis, s.settings.namespace)).sweep().to_json()


@app.task(name="liyagent.retention", ignore_result=True)
def retention() -> dict[str, object]:
    """One retention pass (runtime/retention.py): bounded batches, each skipping what another
    beat's pass holds."""
    return run_retention(services()).to_json()
