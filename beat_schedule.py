"""What beat fires: the Teams inbox intake (every sweep interval), the answer purge, retention
(LIYAGENT_RETENTION_INTERVAL_S) and the catalog's cron triggers. Two beats are harmless: each
task decides in Postgres. The lease sweeper is not beat's: every worker's main process runs it
on a thread of its own (runtime/recovery/sweeper.py `SweepThread`), so it never waits behind
runs."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from celery.schedules import crontab

from runtime.base.settings import Settings
from runtime.core import catalog


def _every(task: str, seconds: float, queue: str, args: list[Any] | None = None) -> dict[str, Any]:
    # A backlog of fires is discarded, not run back to back.
    return {
        "task": task,
        "schedule": timedelta(seconds=seconds),
        "args": args or [],
        "options": {"expires": seconds, "queue": queue},
    }


def schedule(settings: Settings) -> dict[str, dict[str, Any]]:
    ops = f"{settings.queue}.ops"
    sweep_s = settings.timings.sweep_interval_ms / 1000
    entries = {
        "liyagent-teams-intake": _every("liyagent.teams_intake", sweep_s, ops),
        "liyagent-purge-answers": _every("liyagent.purge_answers", 600, ops),
    }
    if settings.retention.enabled:
        entries["liyagent-retention"] = _every(
            "liyagent.retention", settings.retention.interval_s, ops
        )
    for trigger in catalog.load(settings.agents_file).cron.values():
        if trigger.every_s is not None:
            entry = _every("liyagent.cron_fire", trigger.every_s, ops, [trigger.name])
        else:
            assert trigger.crontab is not None
            minute, hour, dom, month, dow = trigger.crontab.split()
            entry = {
                "task": "liyagent.cron_fire",
                "args": [trigger.name],
                "schedule": crontab(
                    minute=minute, hour=hour, day_of_month=dom, month_of_year=month, day_of_week=dow
                ),
                "options": {"expires": 55, "queue": ops},
            }
        entries[f"cron:{trigger.name}"] = entry
    return entries
