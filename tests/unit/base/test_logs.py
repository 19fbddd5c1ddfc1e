"""Logs: the per-request lines of the HTTP client are kept out of production logs."""

from __future__ import annotations

import logging

import pytest

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
