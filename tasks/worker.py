"""How a worker's main process takes part in recovery: it names itself in Redis, reserves the
messages it receives, watches for dead processes, and claims at once the run of a pool child
it saw die (Celery's WorkerLostError), without waiting for a lease or a sweep."""

from __future__ import annotations

import os
from typing import Any

import sqlalchemy as sa
import structlog
from billiard.einfo import ExceptionWithTraceback
from billiard.exceptions import WorkerLostError
from celery import Task
from celery.concurrency import ALIASES as POOL_ALIASES
from celery.worker.request import Request

from runtime.base import faults
from runtime.base.settings import get_settings
from runtime.core.code_versions import noted_version
from runtime.fleet.leases import Token
from runtime.ops import startup
from runtime.recovery import outage
from runtime.recovery.deaths import DeathWatchThread, claim_dead_child
from runtime.recovery.deps import RecoveryDeps
from runtime.recovery.sweeper import SweepThread
from runtime.services import holder_of
from tasks.app import app
from tasks.deliveries import broker_sweeper, held_runs
from tasks.services import RUN_TASK, services

log = structlog.get_logger(__name__)

# The worker's main process (recorded before the pool forks, so children know it too): the
# holder that reserves messages.
_main_pid = os.getpid()
_watch: DeathWatchThread | None = None
_sweeps: SweepThread | None = None


def note_main_process() -> None:
    global _main_pid
    _main_pid = os.getpid()


def main_holder() -> str:
    return holder_of(_main_pid)


def pool_name(controller: Any) -> str:
    """The name (`prefork`, `gevent`, ...) of the pool a starting worker (Celery's
    WorkController, at `worker_init`) was given: a class from the command line, or a name or
    "module:Class" from the configuration."""
    pool = controller.pool_cls
    target = pool if isinstance(pool, str) else f"{pool.__module__}:{pool.__qualname__}"
    target = str(POOL_ALIASES.get(target, target))
    return next((str(name) for name, path in POOL_ALIASES.items() if path == target), target)


def warn_of_unusable_agents() -> None:
    """One line per agent whose runs this worker would fail (its model's endpoint undeclared,
    its key missing), said once at start, naming the agent and what to set."""
    for problem in startup.agent_problems(get_settings()):
        log.warning("worker.agent_unusable", problem=problem)


def warn_unless_consuming_runs(controller: Any) -> None:
    """One line at start when the worker's queues (`-Q`) leave out the runs' queue."""
    queue = get_settings().queue
    consumed = list(controller.app.amqp.queues.consume_from)
    warning = startup.queue_warning(consumed, queue)
    if warning is not None:
        log.warning("worker.runs_queue_not_consumed", why=warning)


def start_watching() -> None:
    """In the main process once the pool runs: its presence, the death watch and the sweeps,
    each on a thread of its own, so both run on time whatever the pool's slots are doing."""
    global _watch, _sweeps
    s = services()
    try:
        # Its code version, noted as the deploy starts it (runtime/core/code_versions.py).
        noted_version(s.engine, s.tools, s.model_profiles())
    except sa.exc.SQLAlchemyError as exc:
        log.warning("worker.code_version_unnoted", error=type(exc).__name__, next="at first use")
    was_up = s.presence.up
    # Each (re)connect of its presence makes it a consumer of its queues again.
    s.presence.consumes = tuple(sorted(app.amqp.queues.consume_from))
    s.presence.start()
    if was_up:  # up already (a message came first): a consumer from now, not its next connect
        s.leases.watch(main_holder(), s.presence.consumes)
    if _watch is None:
        traced = held_runs(s.redis, s.settings.namespace, s.settings.queue)
        _watch = DeathWatchThread(RecoveryDeps.of(s), s.presence, traced)
        _watch.start()
    if _sweeps is None and s.settings.worker_sweeps:
        notice = outage.Notice.of(s)
        _sweeps = SweepThread(
            broker_sweeper(s),
            s.heartbeat.reach,
            lambda work: outage.tolerated(notice, main_holder(), work),
        )
        _sweeps.start()


def stop_watching() -> None:
    """In the main process (Celery's `worker_shutdown`) as the worker ends cleanly: it leaves
    the holders the death watch takes when they go (unless it still holds work), so a clean
    exit is not taken as a death."""
    try:
        s = services()
        s.presence.consumes = ()  # a reconnect while it stops must not put it back
        s.leases.unwatch(main_holder())
    except Exception as exc:  # the death watch takes it (it holds nothing) after its grace
        log.warning("worker.unwatch_failed", error=type(exc).__name__)


def reserved(request: Any) -> None:
    """A run message was received (reserved) by this process: make it visible to the death
    watch, so that if this process dies the run is published again at once."""
    if getattr(request, "name", None) != RUN_TASK:
        return
    run_id, attempt = _run_of(request)
    s = services()
    s.presence.start()
    faults.point("before_reserve")
    s.leases.reserve(main_holder(), run_id, attempt)


def _run_of(request: Any) -> tuple[str, int]:
    args = list(request.args or [])
    return str(args[0]), int(args[1])


class RunRequest(Request):  # type: ignore[misc]
    """The run task's request in the main process: a pool child lost with a run is claimed
    now, and a failed delivery stops being a reservation. (A delivery that ran let its
    reservation go in its lease's acquire: Celery's prefork pool replaces `on_success` with
    its own, so no hook runs here on success.)"""

    def on_failure(
        self, exc_info: Any, send_failed_event: bool = True, return_ok: bool = False
    ) -> Any:
        result = super().on_failure(exc_info, send_failed_event, return_ok)
        exc = exc_info.exception
        if isinstance(exc, ExceptionWithTraceback):
            exc = exc.exc
        self._unreserve()
        if isinstance(exc, WorkerLostError) and self.worker_pid:
            run_id, attempt = _run_of(self)
            token = Token(run_id, attempt, holder_of(self.worker_pid))
            try:
                claimed = claim_dead_child(RecoveryDeps.of(services()), token)
                log.info("deaths.pool_child", run_id=run_id, pid=self.worker_pid, claimed=claimed)
            except Exception:  # the death watch and the sweeper still recover it
                log.exception("deaths.pool_child_failed", run_id=run_id)
        return result

    def _unreserve(self) -> None:
        try:
            run_id, attempt = _run_of(self)
            services().leases.unreserve(main_holder(), run_id, attempt)
        except Exception:  # a stale reservation is harmless: its run is checked before use
            log.warning("reservation.release_failed")


class RunTask(Task):  # type: ignore[misc]
    Request = RunRequest
