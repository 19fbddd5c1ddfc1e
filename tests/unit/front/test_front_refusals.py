"""Refused connections are counted and written as one line per interval: a failed accept()
(too many open files) and uvicorn's per-connection warnings included, none with a traceback."""

from __future__ import annotations

import asyncio
import errno
import logging

from structlog.testing import capture_logs

from front.connections import ACCEPT_FAILED, ConnectionGuard, UvicornNoise
from front.limits import FrontLimits

INTERVAL_S = 0.05


async def _flood(guard: ConnectionGuard) -> None:
    loop = asyncio.get_running_loop()
    loop.set_exception_handler(guard.accept_failed)
    noisy = logging.getLogger("test.front.uvicorn")
    noisy.addFilter(UvicornNoise(guard))
    for _ in range(500):
        error = OSError(errno.EMFILE, "Too many open files")
        loop.call_exception_handler({"message": ACCEPT_FAILED, "exception": error})
        noisy.warning("Invalid HTTP request received.")
        noisy.warning("Unsupported upgrade request.")
    await asyncio.sleep(INTERVAL_S * 3)
    for _ in range(7):
        loop.call_exception_handler({"message": ACCEPT_FAILED, "exception": OSError()})
    await asyncio.sleep(INTERVAL_S * 3)


def test_a_flood_of_refusals_is_one_line_per_interval(caplog) -> None:
    guard = ConnectionGuard(FrontLimits(refusal_log_s=INTERVAL_S))
    with capture_logs() as lines, caplog.at_level(logging.WARNING):
        asyncio.run(_flood(guard))
    refused = [x for x in lines if x["event"] == "front.connections_refused"]
    assert [(x.get("accept_failed"), x.get("bad_head")) for x in refused] == [
        (500, 500),
        (7, None),
    ]
    assert all(x["log_level"] == "warning" for x in refused)
    assert caplog.records == []  # nothing of the flood went to the standard logs
