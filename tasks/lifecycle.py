"""The signals that tie worker and beat life to the engine: the checks before a process
starts, the pool's sizing, the drain flag, the main process's presence and death watch, and
each pool child's fresh connections. Loaded by the app's `include` list (Celery imports it
before it sends `worker_init` or `beat_init`)."""

from __future__ import annotations

import sys
from typing import Any

from celery import signals

from runtime.base import drain, logs, process, tracing
from runtime.ops import startup
from tasks import pools, worker


def _refuse_unless_ready(what: str, *, database: bool = False, controller: Any = None) -> None:
    """Stop this process now, with the reason and the CLI's exit code for it, rather than take
    messages it would fail (and ack, or requeue) one by one: production without seal keys, a
    tool module that does not load, a worker's database out of reach or an unsupported pool."""
    try:
        if controller is not None:
            startup.check_pool(worker.pool_name(controller))
        startup.check(database=database)
    except startup.StartupRefused as exc:
        print(f"liyagent {what} does not start: {exc}", file=sys.stderr, flush=True)
        raise SystemExit(exc.code) from None


@signals.worker_init.connect
def _on_worker_init(sender: Any = None, **_: Any) -> None:
    logs.configure()
    _refuse_unless_ready("worker", database=True, controller=sender)
    worker.warn_unless_consuming_runs(sender)
    worker.warn_of_unusable_agents()
    pools.size_and_check(sender)  # before the pool forks or any connection opens
    drain.install()  # before the pool forks, so children share the flag
    worker.note_main_process()


@signals.worker_ready.connect
def _on_worker_ready(**_: Any) -> None:
    # The pool runs: the main process names itself in Redis and watches for dead processes.
    worker.start_watching()


@signals.task_received.connect
def _on_task_received(request: Any = None, **_: Any) -> None:
    worker.reserved(request)


@signals.worker_process_init.connect
def _on_child_start(**_: Any) -> None:
    # The parent's engines, Redis sockets and clients are not this child's (its death would
    # go unseen): what each becomes is said in one place, runtime/base/process.py.
    process.child_started()


@signals.worker_shutting_down.connect
def _on_shutting_down(**_: Any) -> None:
    # Warm shutdown: runs hand themselves back at their next step boundary.
    drain.request()


@signals.beat_init.connect
def _on_beat_init(**_: Any) -> None:
    logs.configure()
    _refuse_unless_ready("beat")


@signals.worker_shutdown.connect
def _on_worker_exit(**_: Any) -> None:
    # A clean exit is not a death: the main process leaves the holders the death watch takes.
    worker.stop_watching()


@signals.worker_process_shutdown.connect
@signals.worker_shutdown.connect
def _on_exit(**_: Any) -> None:
    # A pool child recycled (max tasks, memory) or stopped, or the worker itself: its spans
    # are exported before it goes (billiard's children exit without atexit handlers).
    tracing.shutdown_here()
