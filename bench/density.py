"""Section 6: density: hundreds of runs in one worker process, and one such process lost.

Throughput: one worker process with `-P threads -c C` (500; quick 20) runs 2C runs of a 4-step
agent (a read, a comment, a read, the answer) at 2 s model latency (quick 0.5 s), all started
at once; then one prefork worker with the same memory budget (`-c 3`: about 125 MiB a slot fits
3 in 400 MiB; quick 2) runs 2 x its slots of the same agent. Ideal = two waves of the agent's
model time (2 x 4 x latency); throughput vs ideal = ideal / (the last run's end - the first
start). Worker CPU per model step = the worker's CPU (/proc/PID/stat: user + system of the
process, its children, and the children it reaped) over the burst / model steps run. RSS is the
peak of the process tree's VmRSS sampled every 0.2 s; Postgres connections are the worker's
(pg_stat_activity by the holder names its connections carry), peak open and peak inside a
statement, against the pool's bound (`-c` + 4). CPU left: what Postgres (the server and its
backends), the simulators and the idle machine had over the burst, in cores.

Mass loss: a `-P threads` victim on a queue of its own holds R runs (300; quick 20) of the same
agent while a `-P threads -c C` survivor serves the main queue; the victim is SIGKILLed once it
has claimed all R. The survivor's death watch sees its connections gone, claims the runs in
batches and publishes them, and the survivor's free threads take them. Kill to resume = kill ->
the resumed attempt's claim (Postgres's clock, the kill trials' measure); lost = runs not
succeeded; duplicates from the simulator's records (a call site that created twice); stale =
anything a lost attempt wrote after its takeover.

Request floor: what one request costs the client through the engine's own guarded HTTP client
(`runtime/sending/http.py`), alone on one thread in the bench process (no other load of its
own): a model step's POST to the simulators' model (a one-step script with no latency) and a
tool's GET (the vendor's ticket read), the median thread CPU of REQUESTS each. A model step of
the 4-step agent makes one model request and, on average, three quarters of a tool request,
so this is the part of the CPU per step that HTTP alone takes on this machine.
"""

from __future__ import annotations

import os
import statistics
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any

import httpx
import sqlalchemy as sa

from bench import procstat, timings
from bench.density_figures import (
    DB_POOL_MAX,
    MODEL_STEPS,
    Burst,
    MassLoss,
    Peaks,
    RequestFloor,
    breakdown_figures,
    figures,
    floor_figures,
    matrix,
)
from bench.lab import Lab, WorkerSpec
from bench.report import Section
from bench.sides import LiyagentSide, start_many, wait_ended
from liyagent.local import judge
from liyagent.local.procs import Proc
from runtime.sending import http
from runtime.services import holder_of

REQUESTS = 300
TOOLS = ["ticket.read", "issue.comment"]


@dataclass(frozen=True)
class DensityOptions:
    threads: int = 500
    prefork: int = 3
    latency_ms: int = 2000
    mass_runs: int = 300
    timeout_s: float = 180.0

    @classmethod
    def quick(cls) -> DensityOptions:
        return cls(threads=20, prefork=2, latency_ms=500, mass_runs=20, timeout_s=90.0)


def four_step(latency_ms: int) -> list[dict[str, Any]]:
    """A read, a comment, a read, the answer: 4 model steps, one write."""

    def calls(c: dict[str, Any]) -> dict[str, Any]:
        return {"calls": [c], "latency_ms": latency_ms}

    return [
        calls({"id": "toolu_read_1", "tool": "ticket.read", "args": {"ticket": "T-1"}}),
        calls(
            {
                "id": "toolu_comment_1",
                "tool": "issue.comment",
                "args": {"issue": "ENG-1", "body": "Investigating."},
            }
        ),
        calls({"id": "toolu_read_2", "tool": "ticket.read", "args": {"ticket": "T-2"}}),
        {"final": "Read, commented, read again.", "latency_ms": latency_ms},
    ]


class _Sampler:
    """Samples a worker's resident memory and its Postgres connections every 0.2 s."""

    def __init__(self, lab: Lab, pid: int, database: str) -> None:
        self.lab, self.pid, self.database = lab, pid, database
        self.peaks = Peaks()
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def __enter__(self) -> Peaks:
        self._thread.start()
        return self.peaks

    def __exit__(self, *_: object) -> None:
        self._done.set()
        self._thread.join()

    def _loop(self) -> None:
        with self.lab.admin() as conn:
            while not self._done.wait(0.2):
                names = [f"lya:{holder_of(p)}" for p in [self.pid, *procstat.descendants(self.pid)]]
                row = conn.execute(
                    sa.text(
                        "SELECT count(*) AS open, count(*) FILTER (WHERE state <> 'idle') "
                        "AS active FROM pg_stat_activity "
                        "WHERE datname = :db AND application_name = ANY(:names)"
                    ),
                    {"db": self.database, "names": names},
                ).one()
                p = self.peaks
                p.rss_mib = max(p.rss_mib, procstat.rss_mib(self.pid))
                p.connections = max(p.connections, int(row.open))
                p.active = max(p.active, int(row.active))
                p.samples += 1


def _launch(lab: Lab, spec: WorkerSpec, pool: str, concurrency: int) -> Proc:
    """A worker, ready; a threads one is timed (bench/timed_worker.py: its threads' CPU)."""
    if pool == "threads":
        env = {**spec.env, "LIYAGENT_DB_POOL_MAX": str(DB_POOL_MAX)}
        spec = timings.timed(replace(spec, env=env), lab.base)
    (proc,) = lab.launch(spec, concurrency=concurrency, pool=pool)
    return proc


def _burst(
    lab: Lab, side: LiyagentSide, worker: Proc, pool: str, c: int, opts: DensityOptions
) -> Burst:
    """2c runs started at once on `worker`; what they cost it and the machine."""
    steps = four_step(opts.latency_ms)
    runs = 2 * c
    pg_pid = procstat.postmaster_pid(lab.pg.data) if lab.pg is not None else 0
    sim_pid = lab.cluster.procs["simulator"].popen.pid
    database = str(side.services.engine.url.database)
    pids = (worker.popen.pid, pg_pid, sim_pid)
    timed = [worker.popen.pid] if pool == "threads" else []
    threads_before = timings.thread_cpu(timings.fresh(timings.directory(lab.base), timed))
    before = [procstat.cpu_seconds(p) for p in pids]
    machine = procstat.MachineTimes.now()
    with _Sampler(lab, worker.popen.pid, database) as peaks:
        started = time.time()
        ids = start_many(side, steps, runs)
        started_all = time.time() - started
        ends = wait_ended(side, ids, opts.timeout_s)
    after = [procstat.cpu_seconds(p) for p in pids]
    idle = procstat.MachineTimes.now().idle - machine.idle
    threads_after = timings.thread_cpu(timings.fresh(timings.directory(lab.base), timed))
    used = [b - a for a, b in zip(before, after, strict=True)]
    used[0] -= timings.own_s(threads_before, threads_after)
    return Burst(
        pool=pool,
        concurrency=c,
        runs=runs,
        seconds=max(ends.values()) - started,
        ideal_s=2 * MODEL_STEPS * opts.latency_ms / 1000,
        worker_cpu_s=used[0],
        postgres_cpu_s=used[1],
        simulator_cpu_s=used[2],
        idle_cpu_s=idle,
        start_s=started_all,
        peaks=peaks,
        split_ms=timings.split_ms(threads_before, threads_after, runs * MODEL_STEPS)
        if timed
        else {},
    )


def _held(side: LiyagentSide, ids: list[str], holder: str) -> int:
    with side.services.engine.connect() as conn:
        return int(
            conn.execute(
                sa.text(
                    "SELECT count(*) FROM runs WHERE id = ANY(CAST(:ids AS uuid[])) "
                    "AND status = 'running' AND claimed_by = :h"
                ),
                {"ids": ids, "h": holder},
            ).scalar_one()
        )


def _mass_loss(lab: Lab, side: LiyagentSide, opts: DensityOptions) -> MassLoss:
    """A threads victim holding `mass_runs` runs SIGKILLed while the threads survivor (on the
    main queue, already up) recovers them (see the module docstring)."""
    victim_settings = replace(side.settings, queue=f"{side.settings.queue}-victim")
    victim = _launch(
        lab, lab.liyagent("density-victim", victim_settings), "threads", opts.mass_runs + 10
    )
    holder = holder_of(victim.popen.pid)
    victim_side = LiyagentSide(victim_settings, lab.seal_keys)
    try:
        # Each run's first step is long, so every run is still held when the last is claimed.
        steps = four_step(opts.latency_ms)
        steps[0] = {**steps[0], "latency_ms": max(opts.latency_ms, 4000)}
        ids = start_many(victim_side, steps, opts.mass_runs)
        deadline = time.monotonic() + opts.timeout_s
        while _held(side, ids, holder) < len(ids):
            if time.monotonic() > deadline:
                raise RuntimeError(f"the victim never held all {len(ids)} runs")
            time.sleep(0.05)
        killed_at = datetime.now(tz=UTC)
        victim.kill()
        wait_ended(side, ids, opts.timeout_s)  # raises when a run failed or never ended
    finally:
        victim_side.close()
        lab.stop(victim)
    resume, claimed, stale = [], [], 0
    vendor = sa.create_engine(lab.sim_db_url, hide_parameters=True)
    try:
        with side.services.engine.connect() as conn, vendor.connect() as vconn:
            found = judge.losses(conn, ids)
            for run_id, losses in found.items():
                loss = losses[0]
                claimed.append((loss.taken_over_at - killed_at).total_seconds())
                at = judge.resumed_at(loss, judge.claims(conn, run_id))
                if at is not None:
                    resume.append((at - killed_at).total_seconds())
                stale += sum(judge.stale_writes(conn, vconn, run_id, loss))
            duplicates = sum(judge.duplicate_writes(vconn, ids).values())
            lost = len(ids) - len(resume)
    finally:
        vendor.dispose()
    return MassLoss(len(ids), resume, lost, duplicates, stale, claimed)


def _request_floor(side: LiyagentSide) -> RequestFloor:
    """The median client CPU of one model POST and one tool GET through the engine's guarded
    client, on one thread (see the module docstring)."""
    spec = side.models.spec([{"final": "floor", "latency_ms": 0}])
    body = {"model": spec["model"], "messages": [{"role": "user", "content": "floor"}]}
    headers = {"Authorization": "Bearer bench"}
    ticket = f"{side.settings.vendor_url.rstrip('/')}/tickets/T-1"
    client = http.new_client()
    try:
        post = _median_cpu_ms(
            lambda: client.post(
                f"{side.settings.vendor_url.rstrip('/')}/v1/chat/completions",
                json=body,
                headers=headers,
            )
        )
        get = _median_cpu_ms(lambda: client.get(ticket))
    finally:
        client.close()
    return RequestFloor(post, get)


def _median_cpu_ms(request: Callable[[], httpx.Response]) -> float:
    samples = []
    for _ in range(REQUESTS):
        started = time.thread_time()
        request().raise_for_status()
        samples.append((time.thread_time() - started) * 1000)
    return statistics.median(samples)


def measure_density(lab: Lab, opts: DensityOptions) -> Section:
    """Section 6 (see the module docstring)."""
    section = Section(
        "density",
        f"6. Density: one -P threads -c {opts.threads} process vs prefork -c {opts.prefork}, "
        f"4-step agent at {opts.latency_ms / 1000:g} s; {opts.mass_runs} runs lost at once",
    )
    settings = lab.settings(lab.database("bench_density"))
    side = LiyagentSide(settings, lab.seal_keys)
    bursts: list[Burst] = []
    mass: MassLoss | None = None
    try:
        floor = _request_floor(side)
        threads = _launch(lab, lab.liyagent("density-threads", settings), "threads", opts.threads)
        try:
            bursts.append(_burst(lab, side, threads, "threads", opts.threads, opts))
            mass = _mass_loss(lab, side, opts)
        finally:
            lab.stop(threads)
        prefork = _launch(lab, lab.liyagent("density-prefork", settings), "prefork", opts.prefork)
        try:
            bursts.append(_burst(lab, side, prefork, "prefork", opts.prefork, opts))
        finally:
            lab.stop(prefork)
    finally:
        side.close()
    section.figures = [
        *figures(bursts, mass),
        *floor_figures(floor),
        *breakdown_figures(bursts[0], floor, os.cpu_count() or 1),
    ]
    section.matrix = matrix(bursts)
    section.detail = {
        "agent": four_step(opts.latency_ms),
        "options": opts.__dict__,
        "request_floor": {
            "model_post_ms": round(floor.model_post_ms, 3),
            "tool_get_ms": round(floor.tool_get_ms, 3),
            "per_step_ms": round(floor.per_step_ms, 3),
            "requests": REQUESTS,
        },
        "bursts": [b.to_json() for b in bursts],
        "mass_loss": None if mass is None else mass.to_json(),
    }
    return section
