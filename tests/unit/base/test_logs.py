"""Logs: the per-request lines of the HTTP client are kept out of production logs."""

from __future__ import annotations

import logging

import pytest
import structlog
from structlog.testing import capture_logs

from runtime.base import logs


@pytest.mark.parametrize(
    ("level", "expected"), [("INFO", logging.WARNING), ("DEBUG", logging.DEBUG)]
)
def test_http_client_request_lines_show_only_at_debug(level: str, expected: int) -> None:
    saved = {name: logging.getLogger(name).level for name in logs.QUIET_LIBRARIES}
    try:
        logs.configure(level=level)
        for name in logs.QUIET_LIBRARIES:
            assert logging.getLogger(name).getEffectiveLevel() == expected
        assert logging.getLogger("httpx").isEnabledFor(logging.INFO) is (level == "DEBUG")
    finally:
        for name, value in saved.items():
            logging.getLogger(name).setLevel(value)
        logs.configure()


def test_an_outage_is_said_once_and_its_end_once() -> None:
    outage = logs.SaidOnce(structlog.get_logger("t"), "thing.unreachable", "thing.reached")
    with capture_logs() as said:
        outage.reached()  # nothing was lost: nothing to say
        for _ in range(3):
            outage.lost(error="refused")
        outage.reached()
        outage.reached()
        outage.lost(error="again")
    assert [(s["event"], s["log_level"]) for s in said] == [
        ("thing.unreachable", "warning"),
        ("thing.reached", "info"),
        ("thing.unreachable", "warning"),
    ]
