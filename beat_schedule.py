"""What beat fires: the lease sweeper, every `LIYAGENT_SWEEP_INTERVAL_MS` (3 s)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from runtime.settings import Settings


def schedule(settings: Settings) -> dict[str, dict[str, Any]]:
    interval = settings.timings.sweep_interval_ms / 1000
    return {
        "liyagent-sweep": {
            "task": "liyagent.sweep",
            "schedule": timedelta(seconds=interval),
            # A backlog of sweeps is discarded, not run back to back.
            "options": {"expires": interval, "queue": f"{settings.queue}.ops"},
        },
    }
