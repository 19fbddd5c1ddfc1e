"""Celery glue: `celery -A tasks worker|beat|flower`, or under a name no team's module takes,
`celery -A liyagent.worker ...` (`liyagent worker|beat|flower`; the same app). Tasks take ids and
call the engine."""

from tasks.app import app

__all__ = ["app"]
