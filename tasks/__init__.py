"""Celery glue: `celery -A tasks worker|beat|flower`. Tasks take ids and call the engine."""

from tasks.app import app

__all__ = ["app"]
