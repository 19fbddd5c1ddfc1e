"""The sweep task beat fires every few seconds."""

from __future__ import annotations

from runtime import outage
from runtime.sweeper import Sweeper
from tasks.app import app
from tasks.deliveries import unacked_runs
from tasks.services import services
from tasks.worker import main_holder


@app.task(name="liyagent.sweep", ignore_result=True)
def sweep() -> dict[str, object] | None:
    s = services()
    sweeper = Sweeper(s, unacked_runs(s.redis, s.settings.namespace))
    return outage.tolerated(s, main_holder(), lambda: sweeper.sweep().to_json())
