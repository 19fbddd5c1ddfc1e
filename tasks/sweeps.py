"""The sweep task beat fires every few seconds."""

from __future__ import annotations

from runtime.sweeper import Sweeper
from tasks.app import app
from tasks.services import services


@app.task(name="liyagent.sweep", ignore_result=True)
def sweep() -> dict[str, object]:
    return Sweeper(services()).sweep().to_json()
