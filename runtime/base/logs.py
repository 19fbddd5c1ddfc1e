"""Structured logs (structlog): JSON lines by default, readable lines on a terminal."""

from __future__ import annotations

import logging
import os
import sys

import structlog

# Libraries whose per-request INFO lines are noise at production volume.
QUIET_LIBRARIES = ("httpx", "httpcore")


class _StderrLoggerFactory:
    """Loggers that write to `sys.stderr` as it is when they write (not as it was when logs
    were configured): a stream swapped out since, by a test's capture or a daemon, is never
    written to after it is closed."""

    def __call__(self, *args: object) -> structlog.PrintLogger:
        return structlog.PrintLogger(file=sys.stderr)


def configure(level: str | None = None) -> None:
    """Route structlog and stdlib logging to stderr; `LIYAGENT_LOG_FORMAT=console|json`."""
    level_name = (level or os.environ.get("LIYAGENT_LOG_LEVEL") or "INFO").upper()
    fmt = os.environ.get("LIYAGENT_LOG_FORMAT") or ("console" if sys.stderr.isatty() else "json")
    renderer: structlog.typing.Processor = (
        structlog.dev.ConsoleRenderer(colors=False)
        if fmt == "console"
        else structlog.processors.JSONRenderer()
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(logging.getLevelName(level_name)),
        logger_factory=_StderrLoggerFactory(),
        cache_logger_on_first_use=False,
    )
    # httpx (the model providers' and the vendor tools' client) logs every request at INFO:
    # two lines a model step in a worker, written under the GIL its task threads share. They
    # are kept for DEBUG; the engine's own events say which step and call each request was.
    quiet = logging.DEBUG if level_name == "DEBUG" else logging.WARNING
    for name in QUIET_LIBRARIES:
        logging.getLogger(name).setLevel(quiet)


class SaidOnce:
    """A store out of reach, said once per outage: a warning when the first call fails, a line
    when one answers again, and nothing in between (a failing call per request must not flood
    the logs)."""

    def __init__(self, log: structlog.typing.FilteringBoundLogger, lost: str, back: str) -> None:
        self.log, self.lost_event, self.back_event = log, lost, back
        self.failing = False

    def lost(self, **facts: object) -> None:
        if not self.failing:
            self.failing = True
            self.log.warning(self.lost_event, **facts)

    def reached(self) -> None:
        if self.failing:
            self.failing = False
            self.log.info(self.back_event)
