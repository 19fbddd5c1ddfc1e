"""liyagent's Celery app under a name no team's module takes:

    celery -A liyagent.worker worker -Q liyagent,liyagent.ops
    celery -A liyagent.worker beat
    celery -A liyagent.worker flower --basic-auth=user:pw

(or `liyagent worker|beat|flower ...`, which run these). The app is `tasks.app.app`, the very
object `celery -A tasks` loads: workers started either way share the queues, tasks and
configuration. Started from a team's directory that holds its own `tasks.py` or
`celeryconfig.py` (Celery's conventions, and liyagent's top-level names), this module loads
liyagent's, never the team's (liyagent/own_modules.py says how); `celery -A tasks` there loads
the team's, as the team chose.
"""

from __future__ import annotations

from liyagent import own_modules

# Before anything of the engine is imported: its names must resolve to liyagent's files.
own_modules.pin()

from tasks.app import app  # noqa: E402 - after pin(), so `tasks` is liyagent's

__all__ = ["app"]
