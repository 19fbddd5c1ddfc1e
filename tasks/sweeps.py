"""One sweep as a task (an operator may fire one by hand; every worker's main process sweeps on
its own thread, tasks/worker.py), and the retention pass beat fires."""

from __future__ import annotations

from runtime.ops.retention import run_retention
from runtime.recovery import outage
from tasks.app import app
from tasks.deliveries import broker_sweeper
from tasks.services import services
from tasks.worker import main_holder


@app.task(name="liyagent.sweep", ignore_result=True)
def sweep() -> dict[str, object] | None:
    s = services()
    sweeper = broker_sweeper(s)
    return outage.tolerated(outage.Notice.of(s), main_holder(), lambda: sweeper.sweep().to_json())


@app.task(name="liyagent.retention", ignore_result=True)
def retention() -> dict[str, object] | None:
    """One retention pass (runtime/ops/retention.py): bounded batches, each skipping what another
    beat's pass holds; a database outage is logged once per interval, not raised."""
    s = services()
    return outage.tolerated(
        outage.Notice.of(s),
        main_holder(),
        lambda: run_retention(s.engine, s.redis, s.settings).to_json(),
    )
