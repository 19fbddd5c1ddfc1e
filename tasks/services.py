"""The engine's services wired to Celery: run messages are published as `liyagent.run`."""

from __future__ import annotations

from collections.abc import Sequence

from celery import Celery

from runtime import services as runtime_services
from runtime.base import faults, process
from runtime.base.settings import get_settings
from runtime.base.tenancy import NORMAL
from runtime.core.deps import AttemptDeps
from runtime.entries.client import Client
from runtime.flow import order
from runtime.services import Services
from store.rows import QueuedAttempt
from tasks.app import app

# The run task's name: its message carries (run id, attempt).
RUN_TASK = "liyagent.run"
# Messages per pipeline round trip when publishing many (bounded, so one batch stays small).
PUBLISH_BATCH = 500


class CeleryPublisher:
    """Publishes the message of one attempt of a run (a hint; Postgres decides), at its
    attempt's priority: resumed runs before new ones (`runtime/flow/order.py`)."""

    def __init__(self, app: Celery, queue: str, resumed_first: bool = True) -> None:
        self.app = app
        self.queue = queue
        self.resumed_first = resumed_first

    def publish(self, run_id: str, attempt: int, priority: int = NORMAL) -> None:
        pri = order.priority(attempt, self.resumed_first, priority)
        for _ in range(faults.publish_times()):
            self.app.send_task(RUN_TASK, args=[run_id, attempt], queue=self.queue, priority=pri)

    def publish_many(self, runs: Sequence[QueuedAttempt]) -> None:
        """Every message in one pipeline (kombu's `Producer.batch`): a publish loop pays a
        round trip per message, and in a thread-pool worker whose threads are busy each round
        trip also waits for the interpreter lock, so 300 of them took seconds. A failed batch
        raises (delivery uncertain): Postgres still has every run (the sweeper's outbox)."""
        if not runs:
            return
        times = faults.publish_times()
        with self.app.producer_or_acquire() as producer, producer.batch(max_size=PUBLISH_BATCH):
            for run in runs:
                pri = order.priority(run.attempt, self.resumed_first, run.priority, run.redelivered)
                for _ in range(times):
                    self.app.send_task(
                        RUN_TASK,
                        args=[run.run_id, run.attempt],
                        queue=self.queue,
                        producer=producer,
                        priority=pri,
                    )


def services() -> Services:
    """This process's services, publishing through the worker's own Celery app."""

    def make() -> Services:
        settings = get_settings()
        publisher = CeleryPublisher(app, settings.queue, settings.resumed_first)
        return runtime_services.build(settings, publisher)

    return runtime_services.for_process(make)


_deps: process.Cache[str, AttemptDeps] = process.Cache("tasks.services", "_deps")


def attempt_deps() -> AttemptDeps:
    """What this process's attempts use of its services, taken once per process."""
    return _deps.get("deps", lambda: AttemptDeps.of(services()))


def client() -> Client:
    """The client API for app processes, publishing through this Celery app."""
    return Client(services())
