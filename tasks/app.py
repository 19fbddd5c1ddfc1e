"""The Celery app: its configuration and the task modules it loads. The signals that tie
worker and beat life to the engine are in `tasks/lifecycle.py`, loaded with the tasks (the
`include` list is imported before a worker's or beat's first signal), so this module imports
nothing of `tasks/` and the glue has no import circle."""

from __future__ import annotations

from celery import Celery

app = Celery(
    "liyagent",
    include=["tasks.lifecycle", "tasks.runs", "tasks.sweeps", "tasks.entries"],
)
app.config_from_object("celeryconfig")
