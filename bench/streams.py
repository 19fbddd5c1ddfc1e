"""`make bench` section `streams` (`python -m bench --only streams`, under a minute): 500
Server-Sent Event streams (`GET /runs/{id}/events`) open on one front process (`python -m
front`), one per queued run, while nothing else runs.

Figures: how long a stream takes from its request to its first event (`queued`, read at
open); what the front holds while the 500 streams wait (its Postgres sessions from
`pg_stat_activity` by its application_name, how many of them are in a statement, its RSS);
then 20 runs are stopped one at a time (`stop_run`: the run fails now, one nudge), and then
all the others in one statement (`stop_agent`: a burst of 480 events at once, every stream
woken together); each stream's `failed` event is timed from its Postgres record (the event's
`at`, the database's clock on this machine) to its arrival at the client, which also shows
the stream closed after the run's last event.
"""

from __future__ import annotations

import asyncio
import json
import time
from datetime import datetime
from typing import Any

import httpx
import sqlalchemy as sa

from bench import agents
from bench.lab import Lab
from bench.procstat import rss_mib
from bench.report import Figure, Section, Target, quantile
from bench.sides import LiyagentSide
from liyagent.local.cluster import child_env
from liyagent.local.procs import Proc, python
from runtime.fleet.presence import connection_name
from runtime.services import holder_of

STREAMS = 500
TOKEN = "bench-streams"
OPEN_TIMEOUT_S = 30.0
# Runs stopped one at a time (one event among the open streams) before the rest at once.
SINGLES = 20
SOURCE = "issue 23"


class _Stream:
    """One client stream: when it was asked for, each event's arrival, whether it ended."""

    def __init__(self, run_id: str) -> None:
        self.run_id = run_id
        self.asked = 0.0
        self.events: list[tuple[dict[str, Any], float]] = []
        self.ended = False
        self.first = asyncio.Event()


async def _read(http: httpx.AsyncClient, base: str, s: _Stream) -> None:
    s.asked = time.time()
    async with http.stream("GET", f"{base}/runs/{s.run_id}/events") as r:
        r.raise_for_status()
        data: list[str] = []
        async for line in r.aiter_lines():
            if line.startswith("data:"):
                data.append(line[5:].strip())
            elif line == "" and data:
                s.events.append((json.loads("\n".join(data)), time.time()))
                data = []
                s.first.set()
        s.ended = True


def _sessions(lab: Lab, front_pid: int) -> tuple[int, int]:
    """The front's Postgres sessions now, and how many of them are not idle (in a statement
    or a transaction)."""
    name = connection_name(holder_of(front_pid))
    with lab.admin() as conn:
        row = conn.execute(
            sa.text(
                "SELECT count(*) AS n, count(*) FILTER (WHERE state <> 'idle') AS busy "
                "FROM pg_stat_activity WHERE application_name LIKE :name"
            ),
            {"name": f"{name}%"},
        ).one()
    return int(row.n), int(row.busy)


async def _measure(
    lab: Lab, side: LiyagentSide, base: str, front: Proc, ids: list[str]
) -> dict[str, Any]:
    limits = httpx.Limits(max_connections=len(ids) + 10, max_keepalive_connections=0)
    headers = {"Authorization": f"Bearer {TOKEN}"}
    timeout = httpx.Timeout(120.0, connect=OPEN_TIMEOUT_S, pool=OPEN_TIMEOUT_S)
    async with httpx.AsyncClient(limits=limits, headers=headers, timeout=timeout) as http:
        streams = [_Stream(i) for i in ids]
        tasks = [asyncio.create_task(_read(http, base, s)) for s in streams]
        await asyncio.wait_for(
            asyncio.gather(*(s.first.wait() for s in streams)), OPEN_TIMEOUT_S * 2
        )
        opened = [s.events[0][1] - s.asked for s in streams]
        await asyncio.sleep(1.5)  # every stream waits on its nudge (past the first re-check)
        sessions, busy = await asyncio.to_thread(_sessions, lab, front.popen.pid)
        rss = rss_mib(front.popen.pid)
        # One run's event at a time while all the streams stay open (the target's case).
        for s, task in list(zip(streams, tasks, strict=True))[:SINGLES]:
            await asyncio.to_thread(side.client.stop_run, s.run_id, reason="bench", by="bench")
            await asyncio.wait_for(task, 30)
        stopped_at = time.time()
        await asyncio.to_thread(
            side.client.stop_agent, "bench-agent", reason="bench: end the streams", by="bench"
        )
        await asyncio.wait_for(asyncio.gather(*tasks), 60)
    lags = []
    for s in streams:
        event, arrived = s.events[-1]
        assert event["kind"] == "failed", event
        lags.append(arrived - datetime.fromisoformat(event["at"]).timestamp())
    return {
        "opened": opened,
        "single_lags": lags[:SINGLES],
        "lags": lags[SINGLES:],
        "sessions": sessions,
        "busy": busy,
        "rss_mib": rss,
        "ended": sum(s.ended for s in streams),
        "stop_to_last_s": max(a for s in streams for _, a in s.events[-1:]) - stopped_at,
    }


def measure_streams(lab: Lab, streams: int = STREAMS) -> Section:
    """Open `streams` SSE streams on one front process; the figures of the module's doc."""
    settings = lab.settings(lab.database("bench_streams"), front_token=TOKEN)
    side = LiyagentSide(settings, lab.seal_keys)
    front: Proc | None = None
    try:
        ids = [side.start(agents.only_final()) for _ in range(streams)]
        env = child_env(settings, lab.seal_keys)
        front = Proc(
            "front", python("-m", "front", "--port", "0"), env, lab.cluster.log_dir / "front.log"
        )
        lab.cluster.procs["front"] = front
        lab.cluster.pids.add(front.popen.pid)
        base = front.wait_for(r"front listening on (http://\S+)", timeout=60).group(1)
        got = asyncio.run(_measure(lab, side, base, front, ids))
    finally:
        if front is not None:
            lab.stop(front)
        side.close()
    opened, lags, singles = got["opened"], got["lags"], got["single_lags"]

    def ms(samples: list[float], q: float) -> float | None:
        found = quantile(samples, q)
        return None if found is None else found * 1000

    figures = [
        Figure("streams", "SSE streams open on one front", float(streams), digits=0),
        Figure(
            "ended",
            "streams closed by the front after the run's last event",
            float(got["ended"]),
            target=Target(">=", float(streams), SOURCE),
            digits=0,
        ),
        Figure("first_p50", "request to first event, p50", ms(opened, 0.5), "ms", digits=0),
        Figure("first_p99", "request to first event, p99", ms(opened, 0.99), "ms", digits=0),
        Figure(
            "pg_sessions",
            "front's Postgres sessions while they wait",
            float(got["sessions"]),
            target=Target("<=", 16, SOURCE),
            digits=0,
        ),
        Figure(
            "pg_busy",
            "of them in a statement while they wait",
            float(got["busy"]),
            target=Target("<=", 1, SOURCE),
            digits=0,
        ),
        Figure("rss", "front RSS with the streams open", got["rss_mib"], "MiB", digits=0),
        Figure(
            "lag_p50",
            "one run's event: Postgres record to client, p50",
            ms(singles, 0.5),
            "ms",
            target=Target("<=", 100, SOURCE),
            digits=0,
        ),
        Figure(
            "lag_p99",
            "one run's event: Postgres record to client, p99",
            ms(singles, 0.99),
            "ms",
            target=Target("<=", 100, SOURCE),
            digits=0,
        ),
        Figure(
            "burst_p50",
            "burst of the rest at once: record to client, p50",
            ms(lags, 0.5),
            "ms",
            digits=0,
        ),
        Figure(
            "burst_p99",
            "burst of the rest at once: record to client, p99",
            ms(lags, 0.99),
            "ms",
            digits=0,
        ),
    ]
    detail = {"stop_to_last_event_s": round(got["stop_to_last_s"], 3), "streams": streams}
    return Section("streams", "Event streams (SSE) on one front", figures, detail=detail)
