"""The sweep task beat fires every few seconds."""

from __future__ import annotations

from runtime.sweeper import Sweeper
from tasks.app import app
from tasks.deliveries import unacked_runs
from tasks.services import services


@app.task(name="liyagent.sweep", ignore_result=True)
def sweep() -> dict[str, object]:
    s = services()
    return Sweeper(s, unacked_runs(s.redis, s.settings.namespace)).sweep().to_json()
