"""`liyagent serve` (the HTTP app front) and `liyagent metrics` (the Prometheus exposition,
read from Postgres and Redis at each scrape)."""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

from liyagent.cli.common import FAILED, OK, USAGE, CliError

if TYPE_CHECKING:
    from prometheus_client.registry import CollectorRegistry


def _port(value: int) -> int:
    if not 0 <= value <= 65535:
        raise CliError(f"--port {value}: use 0-65535 (0 picks a free port)", USAGE)
    return value


def cmd_serve(args: argparse.Namespace) -> int:
    """Serve the app front until SIGTERM or SIGINT; exit with the server's own code."""
    from runtime.base.extras import need

    return int(need("front", "front.server").serve(args.host, _port(args.port)))


def cmd_metrics(args: argparse.Namespace) -> int:
    """--once: print the exposition (exit 3 if Postgres or Redis cannot be read); otherwise
    serve it on HOST:PORT/metrics until interrupted."""
    from runtime.ops.metrics import exposition, registry_for
    from tasks.services import services

    port = _port(args.port)
    s = services()
    sources = (s.engine, s.redis, s.settings.namespace)
    named = s.settings.tenants.named
    if args.once:
        sys.stdout.write(exposition(*sources, named))
        sys.stdout.flush()
        return OK
    return _serve_metrics(registry_for(*sources, named_tenants=named), args.host, port)


def _serve_metrics(registry: CollectorRegistry, host: str, port: int) -> int:
    """prometheus_client's HTTP server in a thread; this thread waits for SIGINT or SIGTERM."""
    from prometheus_client import start_http_server

    try:
        server, thread = start_http_server(port, addr=host, registry=registry)
    except OSError as exc:
        raise CliError(
            f"cannot listen on {host}:{port} ({exc.strerror}); choose another --port", FAILED
        ) from None
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    print(f"metrics listening on http://{host}:{server.server_port}/metrics", flush=True)
    try:
        while not stop.wait(0.5):
            pass
    except KeyboardInterrupt:
        pass
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)
    return OK


def _serve(p: argparse.ArgumentParser) -> None:
    p.add_argument("--host", default="127.0.0.1", help="interface to bind (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8000, help="port (default 8000; 0 picks one)")
    p.set_defaults(handler=cmd_serve)


def _metrics(p: argparse.ArgumentParser) -> None:
    p.description = (
        "Without --once, serve the exposition at http://HOST:PORT/metrics until interrupted. "
        "It needs no credentials, so bind it to a private interface. A source that cannot "
        "be read is reported as liyagent_source_up 0; with --once it exits 3 instead."
    )
    p.add_argument("--host", default="127.0.0.1", help="interface to bind (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=9464, help="port (default 9464; 0 picks one)")
    p.add_argument("--once", action="store_true", help="print the exposition once and exit")
    p.set_defaults(handler=cmd_metrics)


ARGUMENTS: dict[str, Callable[[argparse.ArgumentParser], None]] = {
    "serve": _serve,
    "metrics": _metrics,
}
