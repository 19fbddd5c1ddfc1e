"""GET /runs/{run_id}/events: a run's events (runtime/ops/events.py) as Server-Sent Events,
through sse-starlette.

Each event is one SSE message: `id` its `seq`, `data` its JSON (`RunEvent.to_json`). A client
that reconnects sends `Last-Event-ID` (a browser's EventSource does it by itself) and gets the
events after that seq: none missed, none repeated, across a worker's death (the run's own
`lost` and `resumed` events show the seam) and a restart of the front (the seq is Postgres's,
not the process's). The stream ends after the run's last event (`delivered` or `failed`); a
reconnect after that gets 204, which tells an EventSource to stop reconnecting.

Bounded: the route checks the run (it exists and the principal may see it: front/auth.py) and
the Last-Event-ID, and reads the first page, before anything is opened (404, 400, 403 as
JSON). Then each read borrows a pooled connection for one
statement; between reads the stream waits on the run's Redis nudge, holding no connection and
no thread. Events are produced only as fast as the client takes them (the generator runs when
the previous message was sent), so a slow reader holds one page at most, and one that reads
nothing for `SEND_TIMEOUT_S` is dropped. A heartbeat comment every `LIYAGENT_SSE_PING_S`
keeps proxies from closing an idle stream.
"""

from __future__ import annotations

import json
import re
import weakref
from collections.abc import AsyncIterator

import structlog
from sse_starlette import EventSourceResponse, ServerSentEvent
from starlette.requests import Request
from starlette.responses import Response

from front.auth import Right, requires, seen_run, services
from front.body import path_uuid
from front.errors import FrontError
from runtime.ops.events import Opened, RunEvent, first_page
from runtime.services import Services

log = structlog.get_logger("front")

# A client that has not taken a message for this long is dropped (its socket buffers full).
SEND_TIMEOUT_S = 30.0
# How soon an EventSource reconnects after the connection broke (it sends Last-Event-ID).
RETRY_MS = 1000
_SEQ = re.compile(r"[0-9]{1,18}")


def last_event_id(request: Request) -> int:
    """The seq the client saw last (`Last-Event-ID`), 0 without one; 400 unless it is a
    non-negative integer."""
    raw = request.headers.get("last-event-id")
    if raw is None or not raw.strip():
        return 0
    if not _SEQ.fullmatch(raw.strip()):
        shown = raw[:40]
        raise FrontError(
            400,
            f"Last-Event-ID must be a non-negative integer, the seq of the last event you "
            f"received (got {shown!r}); send it as it came in the event's id, or omit it to "
            "read from the first event",
        )
    return int(raw.strip())


def message(event: RunEvent) -> ServerSentEvent:
    """One run event as one SSE message (`id` its seq, so a reconnect resumes after it)."""
    return ServerSentEvent(data=json.dumps(event.to_json()), id=str(event.seq), retry=RETRY_MS)


async def stream(s: Services, opened: Opened) -> AsyncIterator[ServerSentEvent]:
    """The first page, then every later event as it is recorded, until the run's last; the
    watch the first page was read under is closed when the stream ends."""
    try:
        async for event in opened.follow(s.engine):
            yield message(event)
    finally:
        s.changes.close(opened.watch)


@requires(Right.READ, query_token=True)
async def run_events(request: Request) -> Response:
    """GET /runs/{run_id}/events: the run's events as SSE, after `Last-Event-ID` if sent; only
    for the principal that started the run, or an operator (404 otherwise)."""
    run_id = path_uuid(request.path_params["run_id"], "run id")
    after = last_event_id(request)
    await seen_run(request, run_id)
    s = services(request)
    # RunNotFound answers 404 before anything is opened; one statement, connection released.
    opened = await first_page(s.engine, s.changes, run_id, after)
    if opened.page.done and not opened.page.events:
        s.changes.close(opened.watch)
        return Response(status_code=204)
    log.info("front.events_opened", run_id=run_id, after=after)
    events = stream(s, opened)
    # A stream the server never started (the client left first) still lets its watch go.
    weakref.finalize(events, s.changes.close, opened.watch)
    return EventSourceResponse(
        events,
        ping=s.settings.sse_ping_s,
        send_timeout=SEND_TIMEOUT_S,
        headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"},
    )
