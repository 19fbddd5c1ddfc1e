"""Section 4: what finding lost runs costs at scale, the sweep and (once it exists) the death
watch, at N running runs in Postgres each holding a live lease in Redis.

Sweep. The running runs are inserted in one statement and their leases taken with Leases'
own acquire, pipelined; the leases belong to H holders, each with a live Redis connection named
after it (as every engine process names its connections), so a death watch sees them alive.
Then, on the index path (the sweep a beat runs every 3 s; the periodic full reconcile is timed
apart, without a target):
  - 0 lapsed: `samples` sweeps with nothing to claim;
  - 1,000 lapsed: `samples` times, 1,000 of the running runs have their lease swapped for a
    300 ms one and left to lapse, and one sweep claims them (each sample is checked to claim
    exactly those); 1,000 fresh running runs with live leases replace them afterwards, so every
    sweep sees N running runs. p50 and p99 (nearest rank) of one sweep's `duration_ms` are
    reported; with 20 samples p99 is the slowest.

Death watch (issue 11). `measure_death_watch` is the one function to adapt: if
`runtime.recovery.deaths` imports, it builds `DeathWatch(deps, presence)` and times `poll()`
with the same N
running runs and live holders, first with no dead holder, then with DEAD_HOLDERS holders that
have leases but no connection (1,000 runs between them), polling until they are claimed or
the grace has long passed.
"""

from __future__ import annotations

import gc
import importlib
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import redis
import sqlalchemy as sa

from bench.bulk import finish_runs, insert_running_runs
from bench.lab import Lab
from bench.report import Figure, Section, Target, quantile
from runtime import services as runtime_services
from runtime.base.sealing import parse_keys
from runtime.fleet.leases import Leases, Token
from runtime.fleet.presence import connection_name
from runtime.recovery.deps import RecoveryDeps
from runtime.recovery.sweeper import Sweeper, SweepReport
from runtime.services import Services
from store.rows import QueuedAttempt
from tasks.deliveries import unacked_runs

SWEEP_P99 = Target("<=", 100.0, "issue 12 (DESIGN.md's index path)")
LAPSED = 1000
LIVE_TTL_MS = 600_000  # the live leases outlast the bench
LAPSE_TTL_MS = 300  # the lapsing ones are gone before the sweep that must claim them
PIPELINE = 5000  # lease scripts per round trip
HOLDERS = 50  # live holders (engine processes) the running runs are spread over
DEAD_HOLDERS = 10
FULL_SAMPLES = 2


class RecordingPublisher:
    """Records what the sweeper would publish (no broker in this section)."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, int]] = []

    def publish(self, run_id: str, attempt: int, priority: int = 2) -> None:
        self.sent.append((run_id, attempt))

    def publish_many(self, runs: Sequence[QueuedAttempt]) -> None:
        self.sent += [(run.run_id, run.attempt) for run in runs]


def pipelined(
    s: Services, ttl_ms: int, tokens: list[Token], release: list[Token] | None = None
) -> int:
    """Take these leases (after releasing `release`, if given) with Leases' own scripts,
    pipelined in batches; how many were taken."""
    taken = 0
    release = release or []
    for start in range(0, max(len(tokens), len(release)), PIPELINE):
        pipe = s.redis.pipeline(transaction=False)
        on_pipe = Leases(pipe, s.settings.namespace, ttl_ms)  # each call queues on the pipeline
        for token in release[start : start + PIPELINE]:
            on_pipe.release(token)
        for token in tokens[start : start + PIPELINE]:
            on_pipe.acquire(token)
        results = pipe.execute()
        taken += sum(1 for ok in results[len(release[start : start + PIPELINE]) :] if ok)
    return taken


def settled_epoch(s: Services | RecoveryDeps) -> None:
    """Redis as it is in a steady fleet: its store epoch began long ago (no store grace holds
    claims back), was reconciled and its lost messages requeued (runtime/fleet/leases.py
    `_EPOCH`)."""
    leases = s.leases
    epoch = leases.store_epoch()
    key = leases.epoch_key
    s.redis.hset(key, mapping={"born_ms": 0, "back_ms": 0, "reconciled": "1", "requeued": "1"})
    if leases.store_epoch().id != epoch.id:
        raise RuntimeError("Redis's store epoch moved while the bench settled it")


def sweep(sweeper: Sweeper, full: bool) -> SweepReport:
    """One sweep, sent down the index-only path or into the full reconcile by setting the sweep
    counter (a count of 1 mod full_scan_every reconciles) and Redis's epoch marker."""
    settled_epoch(sweeper.s)  # Redis kept its data: no forced reconcile, no grace
    sweeper.s.redis.set(sweeper.count_key, 0 if full else 1)  # next count: 1 full, 2 index
    report = sweeper.sweep()
    if not report.ran or report.full_scan != full:
        raise RuntimeError(f"the sweep did not take the path asked for: {report.to_json()}")
    return report


@dataclass
class Population:
    """The running runs and the holders of their live leases."""

    s: Services
    holders: list[str]
    live: list[Token] = field(default_factory=list)
    connections: list[redis.Redis[bytes]] = field(default_factory=list)

    def connect_holders(self) -> None:
        for holder in self.holders:
            client: redis.Redis[bytes] = redis.Redis.from_url(
                self.s.settings.redis_url, client_name=connection_name(holder)
            )
            client.ping()
            self.connections.append(client)

    def add(self, count: int) -> list[Token]:
        """Insert `count` running runs spread over the holders (each run claimed by the holder
        of its lease, as the engine records it) and take their live leases."""
        tokens: list[Token] = []
        with self.s.engine.connect() as conn:
            for i, holder in enumerate(self.holders):
                share = count // len(self.holders) + (1 if i < count % len(self.holders) else 0)
                if share:
                    ids = insert_running_runs(conn, share, holder=holder)
                    tokens += [Token(str(r), 1, holder) for r in ids]
        taken = pipelined(self.s, LIVE_TTL_MS, tokens)
        if taken != len(tokens):
            raise RuntimeError(f"took {taken} of {len(tokens)} live leases")
        self.live += tokens
        return tokens

    def lapse(self, count: int) -> list[Token]:
        """Swap `count` live leases for short ones and wait until they have lapsed."""
        chosen, self.live = self.live[:count], self.live[count:]
        taken = pipelined(self.s, LAPSE_TTL_MS, chosen, release=chosen)
        if taken != len(chosen):
            raise RuntimeError(f"took {taken} of {len(chosen)} short leases")
        time.sleep(LAPSE_TTL_MS / 1000 + 0.2)
        return chosen

    def close(self) -> None:
        for client in self.connections:
            client.close()


def _sweeps(pop: Population, publisher: RecordingPublisher, samples: int) -> dict[str, Any]:
    """The timings at one size (see the module docstring)."""
    # As the sweep task builds it: it also reads the broker's unacknowledged run messages.
    sweeper = Sweeper(RecoveryDeps.of(pop.s), unacked_runs(pop.s.redis, pop.s.settings.namespace))
    sweep(sweeper, full=False)  # the first reads of fresh rows set hint bits: not a sample
    idle = [sweep(sweeper, full=False).duration_ms for _ in range(samples)]
    lapsed: list[float] = []
    wrong = 0
    for _ in range(samples):
        publisher.sent.clear()
        chosen = pop.lapse(LAPSED)
        report = sweep(sweeper, full=False)
        lapsed.append(report.duration_ms)
        wrong += int(set(report.claimed) != {t.run_id for t in chosen})
        _finish(pop.s, report.claimed)
        pop.add(LAPSED)
    full = [sweep(sweeper, full=True).duration_ms for _ in range(FULL_SAMPLES)]
    return {
        "idle_ms": [round(x, 3) for x in idle],
        "lapsed_ms": [round(x, 3) for x in lapsed],
        "full_reconcile_ms": [round(x, 3) for x in full],
        "sweeps_not_claiming_exactly_the_lapsed": wrong,
    }


def _finish(s: Services, run_ids: list[str]) -> None:
    with s.engine.begin() as conn:
        finish_runs(conn, run_ids)


def measure_death_watch(s: Services, pop: Population, samples: int) -> dict[str, Any]:
    """DeathWatch.poll() at this size, with no dead holder and with DEAD_HOLDERS (issue 11).
    Returns {"not_measured": why} until runtime.recovery.deaths exists or when its API differs."""
    try:
        deaths = importlib.import_module("runtime.recovery.deaths")
    except ImportError:
        return {"not_measured": "runtime.recovery.deaths not present"}
    try:
        watch = deaths.DeathWatch(RecoveryDeps.of(s), s.presence)
    except Exception as exc:  # the API is the lead's: say what did not fit
        return {"not_measured": f"DeathWatch(deps, presence) failed: {type(exc).__name__}: {exc}"}

    def timed() -> float:
        started = time.perf_counter()
        watch.poll()
        return (time.perf_counter() - started) * 1000

    idle = [timed() for _ in range(samples)]
    dead_pop = Population(
        s, [f"bench-dead-{uuid.uuid4().hex[:6]}-{i}" for i in range(DEAD_HOLDERS)]
    )
    tokens = dead_pop.add(LAPSED)  # leases held by holders that never connected
    with_dead: list[float] = []
    deadline = time.monotonic() + 10.0
    claimed = 0
    while time.monotonic() < deadline:
        with_dead.append(timed())
        claimed = _claimed(s, [t.run_id for t in tokens])
        if claimed == len(tokens):
            break
        time.sleep(0.05)
    return {
        "idle_ms": [round(x, 3) for x in idle],
        "with_dead_ms": [round(x, 3) for x in with_dead],
        "dead_runs": len(tokens),
        "dead_runs_claimed": claimed,
    }


def _claimed(s: Services, run_ids: list[str]) -> int:
    with s.engine.connect() as conn:
        return int(
            conn.execute(
                sa.text(
                    "SELECT count(*) FROM runs WHERE id = ANY(CAST(:ids AS uuid[])) AND attempt > 1"
                ),
                {"ids": run_ids},
            ).scalar()
            or 0
        )


def measure_sweeps(lab: Lab, sizes: tuple[int, ...], samples: int) -> Section:
    """Section 4 (see the module docstring)."""
    section = Section(
        "sweeps", f"4. Sweep and death-detection cost ({samples} samples each; index path)"
    )
    detail: dict[str, Any] = {
        "method": __doc__,
        "samples": samples,
        "holders": HOLDERS,
        "lapsed": LAPSED,
    }
    rows: list[list[str]] = []
    for n in sizes:
        publisher = RecordingPublisher()
        settings = lab.settings(lab.database(f"bench_sweep_{n}"))
        s = runtime_services.build(settings, publisher, sealer=parse_keys(lab.seal_keys))
        pop = Population(s, [f"bench-live-{i}" for i in range(HOLDERS)])
        try:
            pop.connect_holders()
            started = time.perf_counter()
            pop.add(n)
            setup_s = time.perf_counter() - started
            # The bench's own 100k tokens would otherwise be walked by the collector's full
            # passes inside a timed sweep (the engine's processes hold no such heap).
            gc.collect()
            gc.freeze()
            got = _sweeps(pop, publisher, samples)
            got["setup_s"] = round(setup_s, 2)
            got["death_watch"] = measure_death_watch(s, pop, samples)
        finally:
            gc.unfreeze()
            pop.close()
            s.redis.close()
            s.engine.dispose()
        detail[str(n)] = got
        for lapsed, key in ((0, "idle_ms"), (LAPSED, "lapsed_ms")):
            ms = got[key]
            p50, p99 = quantile(ms, 0.5), quantile(ms, 0.99)
            target = SWEEP_P99 if (n, lapsed) == (100_000, LAPSED) else None
            section.figures += [
                Figure(
                    f"sweep_p50_{n}_{lapsed}",
                    f"sweep p50, {n:,} running, {lapsed:,} lapsed",
                    p50,
                    "ms",
                    hidden=True,
                ),
                Figure(
                    f"sweep_p99_{n}_{lapsed}",
                    f"sweep p99, {n:,} running, {lapsed:,} lapsed",
                    p99,
                    "ms",
                    target,
                ),
            ]
            rows.append(
                [
                    f"sweep (index path), {lapsed:,} lapsed",
                    f"{n:,}",
                    f"{p50:.1f}",
                    f"{p99:.1f}",
                    f"{max(ms):.1f}",
                    str(len(ms)),
                ]
            )
        full = got["full_reconcile_ms"]
        rows.append(
            [
                "full reconcile (every 20th sweep), 0 lapsed",
                f"{n:,}",
                f"{quantile(full, 0.5):.1f}",
                "-",
                f"{max(full):.1f}",
                str(len(full)),
            ]
        )
        dw = got["death_watch"]
        if "not_measured" in dw:
            rows.append(
                ["DeathWatch.poll()", f"{n:,}", "not measured:", dw["not_measured"], "", ""]
            )
            section.figures.append(
                Figure(
                    f"death_poll_p99_{n}",
                    f"DeathWatch.poll() p99, {n:,} running",
                    None,
                    "ms",
                    note=f"not measured: {dw['not_measured']}",
                )
            )
        else:
            for label, key in (
                ("no dead holder", "idle_ms"),
                (f"{DEAD_HOLDERS} dead holders, {dw['dead_runs']} runs", "with_dead_ms"),
            ):
                ms = dw[key]
                rows.append(
                    [
                        f"DeathWatch.poll(), {label}",
                        f"{n:,}",
                        f"{quantile(ms, 0.5):.1f}",
                        f"{quantile(ms, 0.99):.1f}",
                        f"{max(ms):.1f}",
                        str(len(ms)),
                    ]
                )
                section.figures.append(
                    Figure(
                        f"death_poll_p99_{n}_{key}",
                        f"DeathWatch.poll() p99, {n:,} running, {label}",
                        quantile(ms, 0.99),
                        "ms",
                    )
                )
    section.matrix = (["what", "running runs", "p50 ms", "p99 ms", "max ms", "samples"], rows)
    section.detail = detail
    wrong = sum(detail[str(n)]["sweeps_not_claiming_exactly_the_lapsed"] for n in sizes)
    if wrong:
        section.error = f"{wrong} sweeps did not claim exactly the runs whose leases lapsed"
    return section
