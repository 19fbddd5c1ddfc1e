"""Concise ``key=value`` logs on stderr for the simulator process, one event per line."""

from __future__ import annotations

import logging
import sys
from typing import Any

LOGGER_NAME = "simulators"


class KeyValueFormatter(logging.Formatter):
    """Render a record as ``ts=... level=... event=... k=v``: greppable and machine-parsable."""

    def format(self, record: logging.LogRecord) -> str:
        """Join the standard fields and the record's ``fields`` extra into one line."""
        fields: dict[str, Any] = {
            "ts": self.formatTime(record, "%Y-%m-%dT%H:%M:%S%z"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "event": record.getMessage(),
        }
        fields.update(getattr(record, "fields", {}))
        line = " ".join(f"{key}={_quote(value)}" for key, value in fields.items())
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


def _quote(value: object) -> str:
    """Quote a value only when it holds spaces, quotes or is empty, to keep lines short."""
    text = str(value)
    if text and not any(ch in text for ch in ' "=\n'):
        return text
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def configure_logging(level: str = "INFO") -> None:
    """Send the simulators' logs to stderr in key=value form at ``level``."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(KeyValueFormatter())
    logger = logging.getLogger(LOGGER_NAME)
    logger.handlers[:] = [handler]
    logger.setLevel(level.upper())
    logger.propagate = False


def log_event(level: int, event: str, exc_info: bool = False, **fields: object) -> None:
    """Log ``event`` with structured ``fields`` under the simulators logger."""
    logger = logging.getLogger(LOGGER_NAME)
    if logger.isEnabledFor(level):
        logger.log(level, event, exc_info=exc_info, extra={"fields": fields})
