"""Celery settings for liyagent, from `LIYAGENT_*` environment variables.

Recovery is the lease sweeper's job, never the broker's: see `visibility_timeout` below.
"""

from __future__ import annotations

import sys
from typing import Any

from beat_schedule import schedule
from runtime.base.settings import ConfigError, Settings, get_settings


def config_for(settings: Settings) -> dict[str, Any]:
    """The Celery configuration for one deployment (tests build one per test namespace)."""
    return {
        "broker_url": settings.redis_url,
        "broker_connection_retry_on_startup": True,
        "broker_transport_options": {
            # Far above the longest run. Kombu redelivers any unacked message older than this,
            # even one whose run is alive (a duplicate run), and a worker start requeues every
            # in-flight message older than it: a short timeout is harmful. Lost runs come back
            # through their lapsed lease instead, within seconds.
            "visibility_timeout": 6 * 3600,
            # Keeps deployments (and test runs) that share one Redis apart.
            "global_keyprefix": settings.namespace,
            # With a sentinel:// URL, the master its Sentinels name (kombu asks them for it on
            # every connection, so the broker follows a failover as the engine's clients do).
            **({"master_name": settings.redis_master} if settings.redis_master else {}),
        },
        "task_default_queue": settings.queue,
        "task_routes": {
            name: {"queue": f"{settings.queue}.ops"}
            for name in (
                "liyagent.sweep",
                "liyagent.cron_fire",
                "liyagent.teams_intake",
                "liyagent.purge_answers",
            )
        },
        "task_acks_late": True,
        # A task that fails is not acked as done: the run task requeues a message it could not
        # handle (celery.exceptions.Reject), and Postgres (the outbox) keeps every run anyway.
        "task_acks_on_failure_or_timeout": False,
        # A task whose pool child dies is requeued instead of acked and forgotten.
        "task_reject_on_worker_lost": True,
        "worker_prefetch_multiplier": 1,
        # Below the visibility timeout, so no live task outlives its message's invisibility.
        "task_time_limit": 5 * 3600,
        "task_ignore_result": True,
        "result_backend": None,
        "task_serializer": "json",
        "accept_content": ["json"],
        # Logs are structlog's JSON lines on stderr, as they are: Celery would otherwise wrap
        # each in its own WARNING line (and pay for a second formatting pass per line).
        "worker_redirect_stdouts": False,
        # Task events cost the worker's main process a publish per received, started and
        # finished task. Off until someone watches: Flower turns them on for every worker
        # (the enable_events control command, every 5 s) while it runs. Queued runs are
        # Postgres's to show (`liyagent status`), so clients send no task-sent events.
        "worker_send_task_events": False,
        "task_send_sent_event": False,
        "timezone": "UTC",
        # Sweeps need no persisted schedule; the in-memory scheduler leaves no file behind.
        "beat_scheduler": "celery.beat:Scheduler",
        "beat_schedule": schedule(settings),
    }


def _settings_or_exit() -> Settings:
    """This process's settings; a bad one stops it here, naming the variable (no traceback:
    Celery reads this module while it parses its own command line)."""
    try:
        return get_settings()
    except ConfigError as exc:
        print(f"liyagent does not start: {exc}", file=sys.stderr, flush=True)
        raise SystemExit(2) from None


globals().update(config_for(_settings_or_exit()))
