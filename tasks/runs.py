"""The run task: one delivery of one attempt's message."""

from __future__ import annotations

from runtime.executor import run_message
from tasks.app import app
from tasks.services import services


@app.task(name="liyagent.run", acks_late=True, reject_on_worker_lost=True, ignore_result=True)
def run(run_id: str, attempt: int) -> str:
    return run_message(services(), run_id, int(attempt))
