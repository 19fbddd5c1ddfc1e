"""Section: what a run's storage costs, measured by Postgres itself (issue 20).

Method. The engine runs in the bench's own process (the real executor and scripted model, the
bench's private Postgres and Redis, no worker process), each part on its own database cloned
from the migrated template.

  long run   one run of S model steps (200), each asking one read whose result is 10 KB of
             random hex (incompressible, as sealed bytes are), then the answer. Before it: a
             CHECKPOINT, then a 2-step warm-up run on the same tables, so the full-page images
             Postgres writes for the first change of each page after a checkpoint (one per page
             per checkpoint, whatever the run's length) fall outside the measured run; their
             count in the run (pg_stat_wal.wal_fpi, cluster-wide) is in the JSON. The read tells
             the bench when it runs (after its step's record is written, before the next step is
             asked), and the bench reads `pg_current_wal_insert_lsn()` there: step n's WAL is the
             distance between the reads at steps n-1 and n (step 1's also holds the claim).
             Bytes written = the WAL from before the enqueue to after the answer; content kept =
             the run's rebuilt state (conversation, calls, counters) as JSON; the tables' growth
             (heap, TOAST via `pg_class.reltoastrelid`, indexes) is read from
             `pg_relation_size` / `pg_total_relation_size` before and after.
  rebuild    what a resume does to get its state: read the run's row and its step records (one
             query) and verify and apply every record (runtime/durable/chain.py), timed R times.
  read step  write statements per step between the reads at steps 11 and 191 (180 read-only
             steps late in a long run), from pg_stat_statements (classified as the counts
             section does; that section gives the same figure for short runs, round trips too).
  soak       P retention periods of K short runs each (3 steps of 4 KB results), retention set
             to keep a finished run (and its audit, and its answer) one period. At the end of
             each period the bench invokes one retention pass (what beat runs: bounded batches,
             oldest first) and then a plain VACUUM (not FULL) of the soak's database, as
             autovacuum does once a table's dead rows pass its threshold (the server keeps
             autovacuum's defaults, whose one-minute naptime is longer than the soak); the
             database's table sizes (heap, TOAST, indexes) are sampled after every period.
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy.pool import NullPool

from bench import storage_tools
from bench.counts import classify
from bench.lab import Lab
from bench.report import Figure, Section, Target
from runtime import services as runtime_services
from runtime.base.sealing import parse_keys
from runtime.base.settings import Retention
from runtime.core.deps import AttemptDeps
from runtime.core.executor import run_message
from runtime.durable import chain
from runtime.entries.client import Client
from runtime.fleet.presence import connection_name
from runtime.ops.retention import run_retention
from runtime.services import Services
from store.checkpoints import select_step_records
from store.rows import QueuedAttempt
from store.runs import get_run

SOURCE = "issue 20"
FLAT = Target("<=", 1.5, SOURCE)
AMPLIFICATION = Target("<=", 3, SOURCE)
REBUILD_MS = Target("<=", 200, SOURCE)
SOAK_GROWTH = Target("<=", 1.2, SOURCE)
READ_STEP_WRITES = Target("<=", 1, SOURCE)
WINDOW = 20  # steps averaged at each end of the long run
READ_STEPS = (11, 191)  # the read-only step window of the long run
TOOL = "bench.blob"
# The engine's tables the soak watches (what retention deletes from).
SOAK_TABLES = ("runs", "run_steps", "call_marks", "transcript_messages", "audit_events")


@dataclass(frozen=True)
class StorageOptions:
    """How much the section measures (written to the JSON)."""

    steps: int = 200
    result_bytes: int = 10_000
    rebuilds: int = 10
    period_s: int = 3
    periods: int = 12
    runs_per_period: int = 20
    soak_steps: int = 3
    soak_result_bytes: int = 4000

    @classmethod
    def of(cls, quick: bool) -> StorageOptions:
        """The full section (about a minute), or --quick's (the same long run, a short soak)."""
        return cls(rebuilds=3, period_s=1, periods=10, runs_per_period=4) if quick else cls()


def _script(steps: int, size: int) -> dict[str, Any]:
    calls = [
        {"calls": [{"id": f"toolu_blob_{n}", "tool": TOOL, "args": {"size": size}}]}
        for n in range(1, steps + 1)
    ]
    return {"provider": "scripted", "script": {"steps": [*calls, {"final": "Read them all."}]}}


def _services(lab: Lab, prefix: str, **changes: Any) -> Services:
    settings = lab.settings(
        lab.database(prefix),
        tool_modules=(storage_tools.__name__,),
        **changes,
    )
    return runtime_services.build(settings, _Unpublished(), sealer=parse_keys(lab.seal_keys))


class _Unpublished:
    """The bench delivers each run's message itself, in-process (nothing is published)."""

    def publish(self, run_id: str, attempt: int, priority: int = 2) -> None:
        return None

    def publish_many(self, runs: Sequence[QueuedAttempt]) -> None:
        return None


def _run(s: Services, steps: int, size: int) -> str:
    run_id = Client(s).start_run(
        agent="bench-storage", model=_script(steps, size), user_input="read", tools=[TOOL]
    )
    ended = run_message(AttemptDeps.of(s), run_id, 1)
    if ended != "succeeded":
        raise RuntimeError(f"run {run_id} ended {ended}, not succeeded: see the bench's stderr")
    return run_id


@contextmanager
def _database(url: str) -> Iterator[sa.Connection]:
    """An autocommit connection to one database, closed (its statistics flushed) at the end."""
    engine = sa.create_engine(
        url, poolclass=NullPool, isolation_level="AUTOCOMMIT", hide_parameters=True
    )
    try:
        with engine.connect() as conn:
            yield conn
    finally:
        engine.dispose()


def _close(s: Services) -> None:
    """Stop what the in-process services started (presence, heartbeat) and close their pools."""
    s.heartbeat.stop()
    s.presence.stop()
    s.redis.close()
    s.engine.dispose()


def _flushed(s: Services, admin: sa.Connection) -> None:
    """Close the services' Postgres connections and wait until their backends are gone: a
    backend reports its WAL statistics (pg_stat_wal) when it exits."""
    s.engine.dispose()
    database = sa.make_url(s.settings.database_url).database
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        left = admin.execute(
            sa.text(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = :db "
                "AND backend_type = 'client backend' AND application_name = :name"
            ),
            {"db": database, "name": connection_name(s.holder)[:63]},
        ).scalar()
        if not left:
            return
        time.sleep(0.05)


def _lsn(conn: sa.Connection) -> int:
    return int(
        conn.execute(sa.text("SELECT pg_current_wal_insert_lsn() - '0/0'::pg_lsn")).scalar_one()
    )


def _wal_stats(conn: sa.Connection) -> dict[str, int]:
    row = conn.execute(sa.text("SELECT wal_records, wal_fpi, wal_bytes FROM pg_stat_wal")).one()
    return {k: int(v) for k, v in row._mapping.items()}


def _write_calls(conn: sa.Connection, database: str) -> tuple[int, int]:
    """(write statement calls, all statement calls) pg_stat_statements counted in `database`."""
    rows = conn.execute(
        sa.text(
            "SELECT s.query, s.calls FROM pg_stat_statements s "
            "JOIN pg_database d ON d.oid = s.dbid WHERE d.datname = :db"
        ),
        {"db": database},
    ).all()
    writes = sum(int(r.calls) for r in rows if classify(str(r.query)) == "write")
    return writes, sum(int(r.calls) for r in rows)


def _sizes(conn: sa.Connection, tables: tuple[str, ...]) -> dict[str, dict[str, int]]:
    """Per table: heap, TOAST (with its index) and total (heap, TOAST, indexes) bytes."""
    rows = conn.execute(
        sa.text(
            "SELECT c.relname, pg_relation_size(c.oid) AS heap, "
            "COALESCE(pg_total_relation_size(NULLIF(c.reltoastrelid, 0)), 0) AS toast, "
            "pg_total_relation_size(c.oid) AS total "
            "FROM pg_class c WHERE c.relname = ANY(:t) AND c.relkind = 'r' "
            "AND c.relnamespace = 'public'::regnamespace"
        ),
        {"t": list(tables)},
    ).all()
    return {r.relname: {"heap": r.heap, "toast": r.toast, "total": r.total} for r in rows}


def _total(sizes: dict[str, dict[str, int]]) -> int:
    return sum(t["total"] for t in sizes.values())


def _mean(values: list[int]) -> float:
    return statistics.fmean(values) if values else float("nan")


def measure_long_run(lab: Lab, opts: StorageOptions) -> dict[str, Any]:
    """The long run's WAL per step, bytes written and kept, table growth, read-step writes,
    and the time to rebuild its state."""
    s = _services(lab, "bench_storage", step_limit=opts.steps + 5)
    database = str(sa.make_url(s.settings.database_url).database)
    tables = ("runs", "run_steps", "transcript_messages")
    try:
        with lab.admin() as admin, _database(s.settings.database_url) as own:
            admin.execute(sa.text("CHECKPOINT"))
            _run(s, 2, opts.result_bytes)  # the warm-up: first-touch page images go here
            _flushed(s, admin)  # its backends exit, so their WAL statistics are reported
            wal_before, sizes_before = _wal_stats(admin), _sizes(own, tables)
            at: dict[int, int] = {}
            calls: dict[int, tuple[int, int]] = {}

            def observe(step: int) -> None:
                at[step] = _lsn(admin)
                if step in READ_STEPS:
                    calls[step] = _write_calls(admin, database)

            start = _lsn(admin)
            storage_tools.observer = observe
            try:
                run_id = _run(s, opts.steps, opts.result_bytes)
            finally:
                storage_tools.observer = None
            end = _lsn(admin)
            _flushed(s, admin)
            wal_after, sizes_after = _wal_stats(admin), _sizes(own, tables)
        rebuild_ms, kept = _rebuilds(s, run_id, opts)
    finally:
        _close(s)
    per_step = [at[n] - at[n - 1] for n in range(2, opts.steps + 1)]
    first = per_step[: WINDOW - 1]  # steps 2-20 (step 1 also pays the claim: shown apart)
    last = per_step[-WINDOW:]
    (a, b) = READ_STEPS
    return {
        "run_id": run_id,
        "wal_start_to_step_1": at[1] - start,
        "wal_per_step": per_step,
        "wal_answer": end - at[opts.steps],
        "wal_first_mean": _mean([at[1] - start, *first]),
        "wal_first_mean_without_claim": _mean(first),
        "wal_last_mean": _mean(last),
        "wal_total": end - start,
        "wal_stats": {k: wal_after[k] - wal_before[k] for k in wal_after},
        "kept": kept,
        "sizes_before": sizes_before,
        "sizes_after": sizes_after,
        "table_growth": _total(sizes_after) - _total(sizes_before),
        "read_step_write_statements": (calls[b][0] - calls[a][0]) / (b - a),
        "read_step_statement_calls": (calls[b][1] - calls[a][1]) / (b - a),
        "rebuild_ms": rebuild_ms,
    }


def _rebuilds(s: Services, run_id: str, opts: StorageOptions) -> tuple[list[float], int]:
    """The resume's work (the run's row, its records in one query, every record verified and
    applied) timed `rebuilds` times; and the size of the state it rebuilds, as JSON."""
    times, kept = [], 0
    for _ in range(opts.rebuilds):
        t0 = time.perf_counter()
        with s.engine.connect() as conn:
            run = get_run(conn, run_id)
            records = select_step_records(conn, run_id)
        state = chain.rebuild(s.sealer, run, records)
        times.append((time.perf_counter() - t0) * 1000)
        if state.step != opts.steps:
            raise RuntimeError(f"run {run_id} rebuilt at step {state.step}, not {opts.steps}")
        kept = len(json.dumps(state.to_payload(), separators=(",", ":")).encode())
    return times, kept


def measure_soak(lab: Lab, opts: StorageOptions) -> dict[str, Any]:
    """Short runs for `periods` retention periods, retention and VACUUM at each period's end;
    the tables' sizes after each."""
    p = opts.period_s
    retention = Retention(
        keep_s=p, key_window_s=p, audit_keep_s=p, batch=8, max_batches=20, interval_s=p
    )
    s = _services(lab, "bench_soak", retention=retention, answer_retention_s=p)
    samples: list[dict[str, Any]] = []
    try:
        with _database(s.settings.database_url) as own:
            t0 = time.monotonic()
            for period in range(1, opts.periods + 1):
                for _ in range(opts.runs_per_period):
                    _run(s, opts.soak_steps, opts.soak_result_bytes)
                time.sleep(max(0.0, t0 + period * p - time.monotonic()))
                report = run_retention(s.engine, s.redis, s.settings)
                own.execute(sa.text("VACUUM"))
                sizes = _sizes(own, SOAK_TABLES)
                live = int(own.execute(sa.text("SELECT count(*) FROM runs")).scalar_one())
                samples.append(
                    {
                        "period": period,
                        "at_s": round(time.monotonic() - t0, 2),
                        "runs_left": live,
                        "deleted": report.to_json(),
                        "total": _total(sizes),
                        "sizes": sizes,
                    }
                )
    finally:
        _close(s)
    return {"retention": asdict(retention), "samples": samples}


def measure_storage(lab: Lab, opts: StorageOptions) -> Section:
    """The long run, its rebuild, and the soak, with issue 20's targets beside the figures."""
    t0 = time.monotonic()
    run = measure_long_run(lab, opts)
    run_s = time.monotonic() - t0
    soak = measure_soak(lab, opts)
    by_period = {x["period"]: x["total"] for x in soak["samples"]}
    after_2, after_10 = by_period.get(2), by_period.get(10)
    kb = 1024
    figures = [
        Figure("wal_first_kb", "WAL per step, steps 1-20 (mean)", run["wal_first_mean"] / kb, "KB"),
        Figure(
            "wal_last_kb", "WAL per step, steps 181-200 (mean)", run["wal_last_mean"] / kb, "KB"
        ),
        Figure(
            "wal_flat_ratio",
            "WAL per step: steps 181-200 / steps 1-20",
            run["wal_last_mean"] / run["wal_first_mean"],
            "x",
            FLAT,
        ),
        Figure("wal_total_mb", "WAL written by the 200-step run", run["wal_total"] / kb**2, "MB"),
        Figure("kept_mb", "content the run keeps (its state as JSON)", run["kept"] / kb**2, "MB"),
        Figure(
            "written_to_kept",
            "WAL written / content kept",
            run["wal_total"] / run["kept"],
            "x",
            AMPLIFICATION,
        ),
        Figure(
            "table_growth_to_kept",
            "tables' growth (heap, TOAST, indexes) / content kept",
            run["table_growth"] / run["kept"],
            "x",
        ),
        Figure(
            "rebuild_p50_ms",
            "rebuild of the 200-step state on resume, p50",
            statistics.median(run["rebuild_ms"]),
            "ms",
            REBUILD_MS,
        ),
        Figure("rebuild_max_ms", "rebuild, slowest", max(run["rebuild_ms"]), "ms"),
        Figure(
            "read_step_write_statements",
            "read-only step (steps 12-191): write statements",
            run["read_step_write_statements"],
            "",
            READ_STEP_WRITES,
        ),
        Figure(
            "soak_after_2_kb",
            "soak: tables after 2 retention periods",
            None if after_2 is None else after_2 / kb,
            "KB",
            digits=0,
        ),
        Figure(
            "soak_after_10_kb",
            "soak: tables after 10 retention periods",
            None if after_10 is None else after_10 / kb,
            "KB",
            digits=0,
        ),
        Figure(
            "soak_growth",
            "soak: tables after 10 periods / after 2",
            None if not (after_2 and after_10) else after_10 / after_2,
            "x",
            SOAK_GROWTH,
        ),
    ]
    section = Section("storage", "Storage: WAL, tables and retention (Postgres's own figures)")
    section.figures = figures
    rows = [
        [
            str(x["period"]),
            f"{x['at_s']:.1f}",
            str(x["runs_left"]),
            str(x["deleted"]["runs"]),
            str(x["deleted"]["batches"]),
            *(f"{x['sizes'].get(t, {}).get('total', 0) / kb:.0f}" for t in SOAK_TABLES),
            f"{x['total'] / kb:.0f}",
        ]
        for x in soak["samples"]
    ]
    section.matrix = (
        ["period", "at s", "runs kept", "deleted", "batches", *SOAK_TABLES, "all KB"],
        rows,
    )
    section.detail = {
        "method": __doc__,
        "options": asdict(opts),
        "server": "the lab's Postgres settings (settings.postgres_settings); autovacuum default",
        "long_run_seconds": round(run_s, 1),
        "long_run": run,
        "soak": soak,
    }
    return section
