"""The run task: one delivery of one attempt's message."""

from __future__ import annotations

import time

import structlog
from celery.exceptions import Reject

from runtime.core.executor import NotHandled, deliver
from tasks.app import app
from tasks.services import RUN_TASK, attempt_deps
from tasks.worker import RunTask, main_holder

log = structlog.get_logger(__name__)

# A message that could not be handled (Redis unreachable before the run was claimed, a worker
# stopping while Postgres is out of reach) goes back to its queue after this pause, instead of
# being acked and dropped. While Postgres is out of reach the message is held (`deliver`).
REQUEUE_PAUSE_S = 1.0


@app.task(
    name=RUN_TASK,
    base=RunTask,
    acks_late=True,
    reject_on_worker_lost=True,
    ignore_result=True,
)
def run(run_id: str, attempt: int) -> str:
    try:
        return deliver(attempt_deps(), run_id, int(attempt), reserved_by=main_holder())
    except NotHandled as exc:
        log.warning("message.requeued", run_id=run_id, attempt=attempt, why=str(exc))
        time.sleep(REQUEUE_PAUSE_S)  # backoff: a broken dependency must not spin the worker
        raise Reject(str(exc), requeue=True) from exc
