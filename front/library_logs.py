"""Libraries' log lines without the values they quote. The A2A SDK logs a refused request's id,
its parse errors (which quote the value refused) and their tracebacks at WARNING and above
(sse-starlette logs a stream's failures with their tracebacks), so their records are written
instead as one structured line each: the logger, where it logged, the message's template (its
arguments withheld; a message without a template is withheld whole), and for an exception its
type and where it was raised (`runtime/base/redact.py`)."""

from __future__ import annotations

import logging

import structlog

from runtime.base.redact import error_facts

log = structlog.get_logger("front")

# Loggers whose records may quote a request's content (an SDK's parse errors, an exception's
# message in a traceback).
LIBRARIES = ("a2a", "sse_starlette")


class WithheldValues(logging.Handler):
    """Writes a record as `front.library_log` with no value of the request in it."""

    def emit(self, record: logging.LogRecord) -> None:
        facts: dict[str, object] = {}
        if record.exc_info and record.exc_info[1] is not None:
            facts = error_facts(record.exc_info[1])
        template = record.msg if isinstance(record.msg, str) and record.args else None
        write = log.error if record.levelno >= logging.ERROR else log.warning
        write(
            "front.library_log",
            logger=record.name,
            logged_at=f"{record.module}:{record.lineno} in {record.funcName}",
            said=template or "withheld: it may carry user text",
            **facts,
        )


def withhold_library_values() -> None:
    """Route `LIBRARIES`' records through `WithheldValues` only (idempotent)."""
    for name in LIBRARIES:
        logger = logging.getLogger(name)
        logger.handlers = [WithheldValues(logging.WARNING)]
        logger.propagate = False
