"""Run the vendor simulators: ``python -m simulators --port 0 --database-url URL``.

Prints one line, ``simulators listening on http://HOST:PORT``, then serves until SIGTERM/SIGINT.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
from collections.abc import Sequence

from simulators.logs import configure_logging, log_event
from simulators.vendor import (
    DEFAULT_INCIDENT_DEDUPE_S,
    DEFAULT_NOTIFY_DEDUPE_S,
    DEFAULT_SOURCE_DOCS,
    serve,
    stop,
)

DEFAULT_DATABASE_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/liyagent"
_STOP_SIGNALS = {signal.SIGTERM, signal.SIGINT}


def _non_negative(value: str) -> float:
    """An argparse type for a window in seconds: a float >= 0."""
    number = float(value)
    if not number >= 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return number


def _count(value: str) -> int:
    """An argparse type for a corpus size: an integer >= 0."""
    number = int(value)
    if number < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return number


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The command line; the database URL defaults to ``LIYAGENT_DATABASE_URL``."""
    parser = argparse.ArgumentParser(prog="python -m simulators", description=__doc__)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8765, help="0 picks a free port")
    parser.add_argument(
        "--database-url", default=os.environ.get("LIYAGENT_DATABASE_URL") or DEFAULT_DATABASE_URL
    )
    parser.add_argument(
        "--incident-dedupe-s",
        type=_non_negative,
        default=DEFAULT_INCIDENT_DEDUPE_S,
        help="window in which a repeated Idempotency-Key replays an incident or a fine-tune job "
        "(default: 86400)",
    )
    parser.add_argument(
        "--notify-dedupe-s",
        type=_non_negative,
        default=DEFAULT_NOTIFY_DEDUPE_S,
        help="short window in which a repeated Idempotency-Key replays a notification "
        "(default: 300)",
    )
    parser.add_argument(
        "--source-docs",
        type=_count,
        default=DEFAULT_SOURCE_DOCS,
        help="documents in the paged source corpus at GET /source/docs (default: 25)",
    )
    parser.add_argument("--log-level", default=os.environ.get("LIYAGENT_LOG_LEVEL") or "INFO")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    """Serve until SIGTERM or SIGINT; 0 on a clean stop, 1 when the server cannot start."""
    args = parse_args(argv)
    configure_logging(args.log_level)
    # Block the stop signals before any thread starts so every thread inherits the mask and
    # the main thread alone receives them through sigwait (no handler runs mid-statement).
    signal.pthread_sigmask(signal.SIG_BLOCK, _STOP_SIGNALS)
    try:
        server, thread = serve(
            args.host,
            args.port,
            args.database_url,
            args.incident_dedupe_s,
            notify_dedupe_s=args.notify_dedupe_s,
            source_docs=args.source_docs,
        )
    except Exception as exc:
        log_event(logging.ERROR, "start_failed", error=f"{type(exc).__name__}: {exc}")
        return 1
    print(f"simulators listening on {server.url}", flush=True)
    received = signal.sigwait(_STOP_SIGNALS)
    log_event(logging.INFO, "stopping", signal=signal.Signals(received).name)
    stop(server, thread)
    return 0


if __name__ == "__main__":
    sys.exit(main())
