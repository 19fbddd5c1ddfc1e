"""The engine's services wired to Celery: run messages are published as `liyagent.run`."""

from __future__ import annotations

from celery import Celery

from runtime import services as runtime_services
from runtime.base import faults, process
from runtime.base.settings import get_settings
from runtime.core.deps import AttemptDeps
from runtime.entries.client import Client
from runtime.services import Services
from tasks.app import app

# The run task's name: its message carries (run id, attempt).
RUN_TASK = "liyagent.run"
# Messages per pipeline round trip when publishing many (bounded, so one batch stays small).
PUBLISH_BATCH = 500


class CeleryPublisher:
    """Publishes the message of one attempt of a run (a hint; Postgres decides)."""

    def __init__(self, app: Celery, queue: str) -> None:
        self.app = app
        self.queue = queue

    def publish(self, run_id: str, attempt: int) -> None:
        for _ in range(faults.publish_times()):
            self.app.send_task(RUN_TASK, args=[run_id, attempt], queue=self.queue)

    def publish_many(self, runs: list[tuple[str, int]]) -> None:
        """Every message in one pipeline (kombu's `Producer.batch`): a publish loop pays a
        round trip per message, and in a thread-pool worker whose threads are busy each round
        trip also waits for the interpreter lock, so 300 of them took seconds. A failed batch
        raises (delivery uncertain): Postgres still has every run (the sweeper's outbox)."""
        if not runs:
            return
        times = faults.publish_times()
        with self.app.producer_or_acquire() as producer, producer.batch(max_size=PUBLISH_BATCH):
            for run_id, attempt in runs:
                for _ in range(times):
                    self.app.send_task(
                        RUN_TASK, args=[run_id, attempt], queue=self.queue, producer=producer
                    )


def services() -> Services:
    """This process's services, publishing through the worker's own Celery app."""

    def make() -> Services:
        settings = get_settings()
        return runtime_services.build(settings, CeleryPublisher(app, settings.queue))

    return runtime_services.for_process(make)


_deps: process.Cache[str, AttemptDeps] = process.Cache("tasks.services", "_deps")


def attempt_deps() -> AttemptDeps:
    """What this process's attempts use of its services, taken once per process."""
    return _deps.get("deps", lambda: AttemptDeps.of(services()))


def client() -> Client:
    """The client API for app processes, publishing through this Celery app."""
    return Client(services())
