"""Section 2: Postgres and Redis work per model step, counted by the servers themselves.

Method. Five groups run side by side, each with its own engine database (a clone of the
migrated template) on the bench's private Postgres, its own private Redis and its own liyagent
worker (`-c 2`, the product's timings, 0 ms model latency):

  idle    no runs: the control (what a warm, idle worker costs over the same window)
  final   R runs of a one-step agent that only answers: the fixed cost of a run
  reads   R runs of k read-only steps (one read each), then the answer
  writes  R runs of k steps with exactly one write each, then the answer
  five    R runs of the issue's 5-step agent (5 calls, 2 writes)

Every worker is warmed (a few runs) first. Postgres's cumulative statistics reach the shared
counters only when a backend flushes them (at most once a second while busy, after 10 s idle, or
when it exits), so the bench waits until every backend on these databases has been idle for
over 10 s before the first snapshot, and stops the workers (their backends exit and flush)
before the second. The window's deltas are then read per database:

  transactions   pg_stat_database xact_commit + xact_rollback (each autocommit statement is one)
  row writes     pg_stat_user_tables n_tup_ins + n_tup_upd + n_tup_del, all tables
  write stmts    pg_stat_statements calls of statements that insert, update, delete or merge
  statements     pg_stat_statements calls, all statements (BEGIN/COMMIT included; it never sees
                 SQLAlchemy's pre-ping, an empty query)
  round trips    counted on the wire: every worker (and the bench's client) reaches Postgres and
                 Redis through a counting proxy (bench/wire.py); a round trip is a burst the
                 client sends before it reads the answer (pings, pipelines and connection
                 start-ups included; a pipeline of Redis commands is one)
  Redis cmds     INFO commandstats calls, all commands but the bench's own INFO (the broker's
                 included, and those a Lua script runs: a lease script counts each of its calls)

The bench's own queries never touch the engine databases inside the window (completion is read
from the simulators' records, in their own database). Per run = (group - idle) / R. Per step:
a read-only step = (reads - final) / k; a step with one write = (writes - final) / k; the
5-step run whole, and divided by its 5 model steps.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import sqlalchemy as sa
from sqlalchemy.pool import NullPool

from bench import agents, settle
from bench.lab import Lab, redis_client
from bench.report import Figure, Section, Target
from bench.sides import BenchError, LiyagentSide, wait_ended
from bench.wire import CountingProxy, WireCounts
from liyagent.local.procs import Proc
from runtime.base.settings import Settings

# Postgres flushes an idle backend's pending statistics after 10 s (PGSTAT_IDLE_INTERVAL).
WARMUP_RUNS = 2
METRICS = (
    "transactions",
    "write_statements",
    "row_writes",
    "statement_calls",
    "pg_round_trips",
    "pg_pings",
    "redis_round_trips",
    "redis_commands",
)
SHORT = {
    "transactions": "xacts",
    "write_statements": "write stmts",
    "row_writes": "row writes",
    "statement_calls": "stmt calls",
    "pg_round_trips": "PG trips",
    "pg_pings": "of them pings",
    "redis_round_trips": "Redis trips",
    "redis_commands": "Redis cmds",
}
LABELS = {
    "transactions": "transactions",
    "write_statements": "write statements",
    "row_writes": "row writes",
    "statement_calls": "statement calls (pg_stat_statements)",
    "pg_round_trips": "Postgres round trips",
    "pg_pings": "of them pings",
    "redis_round_trips": "Redis round trips",
    "redis_commands": "Redis commands",
}
READ_STEP = {
    "write_statements": Target("<=", 1),
    "pg_round_trips": Target("<=", 3),
    "redis_round_trips": Target("<=", 1),
}
RUN_ROW_WRITES = Target("<=", 12)


@dataclass
class Group:
    kind: str
    steps: agents.Steps | None
    database_url: str  # direct (the bench's own reads)
    redis_url: str  # direct (INFO)
    pg_proxy: CountingProxy
    redis_proxy: CountingProxy
    settings: Settings  # through the proxies (the worker's and the client's)
    side: LiyagentSide | None = None
    worker: Proc | None = None
    ids: list[str] = field(default_factory=list)

    @property
    def database(self) -> str:
        return str(sa.make_url(self.database_url).database)


def classify(query: str) -> str:
    """ping, read, write or utility, from a normalized statement's text."""
    q = re.sub(r"/\*.*?\*/", " ", query, flags=re.S).strip().lower()
    if re.fullmatch(r"select (\$1|1);?", q):
        return "ping"
    first = q.split(None, 1)[0] if q else ""
    unlocked = re.sub(r"\bfor\s+(no\s+key\s+)?update\b|\bfor\s+(key\s+)?share\b", " ", q)
    if first in ("select", "with", "insert", "update", "delete", "merge", "values"):
        return "write" if re.search(r"\b(insert|update|delete|merge)\b", unlocked) else "read"
    return "utility"


@dataclass
class Snapshot:
    xacts: dict[str, int]
    statements: dict[tuple[str, int], tuple[str, int]]  # (db, queryid) -> (query, calls)
    redis: dict[str, dict[str, int]]  # url -> command -> calls
    wire: dict[str, tuple[WireCounts, WireCounts]]  # db -> (Postgres, Redis) on the wire
    tuples: dict[str, dict[str, int]] = field(default_factory=dict)  # db -> table -> writes


def _server_counters(lab: Lab, groups: list[Group]) -> Snapshot:
    dbs, redis_urls = [g.database for g in groups], [g.redis_url for g in groups]
    wire = {g.database: (g.pg_proxy.snapshot(), g.redis_proxy.snapshot()) for g in groups}
    with lab.admin() as conn:
        xacts = {
            r.datname: int(r.n)
            for r in conn.execute(
                sa.text(
                    "SELECT datname, xact_commit + xact_rollback AS n FROM pg_stat_database "
                    "WHERE datname = ANY(:dbs)"
                ),
                {"dbs": dbs},
            )
        }
        statements = {
            (r.datname, int(r.queryid)): (str(r.query), int(r.calls))
            for r in conn.execute(
                sa.text(
                    "SELECT d.datname, s.queryid, s.query, s.calls FROM pg_stat_statements s "
                    "JOIN pg_database d ON d.oid = s.dbid WHERE d.datname = ANY(:dbs)"
                ),
                {"dbs": dbs},
            )
        }
    redis_stats = {}
    for url in redis_urls:
        client = redis_client(url)
        try:
            stats = client.info("commandstats")
        finally:
            client.close()
        redis_stats[url] = {
            k.removeprefix("cmdstat_"): int(v["calls"])
            for k, v in stats.items()
            if isinstance(v, dict)
        }
    return Snapshot(xacts, statements, redis_stats, wire)


def _tuples(database_url: str) -> dict[str, int]:
    """Row writes per table so far (read on a connection that is closed at once)."""
    engine = sa.create_engine(database_url, poolclass=NullPool, hide_parameters=True)
    try:
        with engine.connect() as conn:
            rows = conn.execute(
                sa.text(
                    "SELECT relname, n_tup_ins + n_tup_upd + n_tup_del AS n "
                    "FROM pg_stat_user_tables"
                )
            ).all()
    finally:
        engine.dispose()
    return {r.relname: int(r.n) for r in rows}


def _setup(lab: Lab, k: int) -> list[Group]:
    kinds: dict[str, agents.Steps | None] = {
        "idle": None,
        "final": agents.only_final(),
        "reads": agents.reads(k),
        "writes": agents.writes(k),
        "five": agents.five_step(0),
    }
    return groups_of(lab, "count", {kind: (steps, lambda s: s) for kind, steps in kinds.items()})


# What a group's worker runs on, made of the lab's settings (bench/ledger.py: the ledger on or off).
Adjust = Callable[[Settings], Settings]


def groups_of(
    lab: Lab, prefix: str, kinds: dict[str, tuple[agents.Steps | None, Adjust]]
) -> list[Group]:
    """A group per kind: its own engine database and Redis behind counting proxies, and a
    liyagent worker on settings the kind's function makes of the lab's (the ledger on or off)."""
    groups = []
    for kind, (steps, adjust) in kinds.items():
        tag = kind.replace("/", "_")
        db, rd = lab.database(f"bench_{prefix}_{tag}"), lab.new_redis()
        pg_url, redis_url = sa.make_url(db), sa.make_url(rd.replace("redis://", "postgresql://"))
        pg_proxy = CountingProxy(pg_url.host or "127.0.0.1", pg_url.port or 5432, postgres=True)
        redis_proxy = CountingProxy(redis_url.host or "127.0.0.1", redis_url.port or 6379)
        proxied_db = pg_url.set(port=pg_proxy.port).render_as_string(hide_password=False)
        proxied_redis = f"redis://127.0.0.1:{redis_proxy.port}/0"
        settings = adjust(lab.settings(proxied_db, proxied_redis))
        groups.append(Group(kind, steps, db, rd, pg_proxy, redis_proxy, settings))
    procs = lab.launch(
        *[lab.liyagent(f"{prefix}-{g.kind.replace('/', '-')}", g.settings) for g in groups]
    )
    for g, proc in zip(groups, procs, strict=True):
        g.worker = proc
        g.side = LiyagentSide(g.settings, lab.seal_keys)
    return groups


def _warm(groups: list[Group], timeout_s: float) -> None:
    started = {
        g.kind: [g.side.start(g.steps or agents.only_final()) for _ in range(WARMUP_RUNS)]
        for g in groups
        if g.side
    }
    for g in groups:
        assert g.side is not None
        wait_ended(g.side, started[g.kind], timeout_s)


def _wait_answered(lab: Lab, groups: list[Group], timeout_s: float) -> None:
    """Wait until the simulators' model has answered every run's last step (its own records,
    in its own database), then until the engine databases are quiet for a second."""
    engine = sa.create_engine(lab.sim_db_url, poolclass=NullPool, hide_parameters=True)
    deadline = time.monotonic() + timeout_s
    try:
        for g in groups:
            if not g.ids or g.steps is None:
                continue
            while True:
                with engine.connect() as conn:
                    n = conn.execute(
                        sa.text(
                            "SELECT count(DISTINCT run_id) FROM sim.requests "
                            "WHERE vendor = 'model' "
                            "AND status = 200 AND call = :step AND run_id = ANY(:ids)"
                        ),
                        {"step": str(len(g.steps)), "ids": g.ids},
                    ).scalar()
                if n == len(g.ids):
                    break
                if time.monotonic() > deadline:
                    raise BenchError(
                        f"counts/{g.kind}: {len(g.ids) - int(n or 0)} runs were not answered "
                        f"within {timeout_s:g} s"
                    )
                time.sleep(0.1)
    finally:
        engine.dispose()
    settle.settled(lab, [g.database for g in groups], 1.0)


def _delta(before: Snapshot, after: Snapshot, g: Group) -> dict[str, Any]:
    """What one group's window cost, in total."""
    db = g.database
    by_kind = {"ping": 0, "read": 0, "write": 0, "utility": 0}
    top: list[tuple[int, str, str]] = []
    for (d, qid), (query, calls) in after.statements.items():
        if d != db:
            continue
        n = calls - before.statements.get((d, qid), (query, 0))[1]
        if n <= 0:
            continue
        kind = classify(query)
        by_kind[kind] += n
        top.append((n, kind, " ".join(query.split())[:200]))
    redis_after, redis_before = after.redis[g.redis_url], before.redis[g.redis_url]
    redis_by_cmd = {c: n - redis_before.get(c, 0) for c, n in redis_after.items() if c != "info"}
    redis_by_cmd = {c: n for c, n in redis_by_cmd.items() if n}
    tables = {t: n - before.tuples[db].get(t, 0) for t, n in after.tuples[db].items()}
    tables = {t: n for t, n in tables.items() if n}
    pg_wire = after.wire[db][0].minus(before.wire[db][0])
    redis_wire = after.wire[db][1].minus(before.wire[db][1])
    return {
        "transactions": after.xacts.get(db, 0) - before.xacts.get(db, 0),
        "write_statements": by_kind["write"],
        "row_writes": sum(tables.values()),
        "pg_round_trips": pg_wire.round_trips,
        "pg_pings": pg_wire.pings,
        "redis_round_trips": redis_wire.round_trips,
        "redis_commands": sum(redis_by_cmd.values()),
        "statement_calls": sum(by_kind.values()),
        "pg_connections": pg_wire.connections,
        "redis_connections": redis_wire.connections,
        "statements_by_kind": by_kind,
        "row_writes_by_table": tables,
        "redis_by_command": redis_by_cmd,
        "statements": [
            {"calls": n, "kind": kd, "query": q} for n, kd, q in sorted(top, reverse=True)
        ],
    }


def _per_run(total: dict[str, Any], idle: dict[str, Any], runs: int) -> dict[str, float]:
    return {m: (total[m] - idle[m]) / runs for m in METRICS}


def scaled(rows: dict[str, float], other: dict[str, float] | None, divide: int) -> dict[str, float]:
    return {m: (rows[m] - (other[m] if other else 0.0)) / divide for m in METRICS}


def measure(
    lab: Lab, groups: list[Group], runs: int, timeout_s: float, settle_s: float, notes: list[str]
) -> tuple[float, dict[str, dict[str, Any]], dict[str, dict[str, float]]]:
    """The measured window over `groups` (every one but `idle` starts `runs` runs): warmed,
    settled, counters reset and read before, runs answered, workers stopped, counters read
    after; the window's length, each group's totals and each group's per run over idle."""
    dbs = [g.database for g in groups]
    try:
        _warm(groups, timeout_s)
        if settle_s < settle.IDLE_FLUSH_S:
            notes.append(
                f"quick: waited {settle_s:g} s, not {settle.IDLE_FLUSH_S:g} s, before the window: "
                "the Postgres counters may include the warm-up's unflushed statistics"
            )
        if not settle.settled(lab, dbs, settle_s, settle.window_limit(settle_s)):
            notes.append("a backend stayed busy: Postgres's counters may lag (see settle)")
        with lab.admin() as conn:
            conn.execute(sa.text("SELECT pg_stat_statements_reset()"))
        tuples_before = {g.database: _tuples(g.database_url) for g in groups}
        settle.flushed_or_note(lab, dbs, notes, settle_s)
        before = _server_counters(lab, groups)
        before.tuples = tuples_before
        window = time.monotonic()
        for _ in range(runs):
            for g in groups:
                if g.steps is not None and g.side is not None and g.kind != "idle":
                    g.ids.append(g.side.start(g.steps))
        _wait_answered(lab, groups, timeout_s)
    finally:
        for g in groups:
            if g.side is not None:
                g.side.close()
        lab.stop(*[g.worker for g in groups if g.worker is not None])
        for g in groups:
            g.pg_proxy.close()
            g.redis_proxy.close()
    window = time.monotonic() - window
    if not settle.gone(lab, dbs):
        notes.append("a backend stayed connected after the workers stopped")
    after = _server_counters(lab, groups)
    after.tuples = {g.database: _tuples(g.database_url) for g in groups}
    _check_succeeded(groups)
    totals = {g.kind: _delta(before, after, g) for g in groups}
    per_run = {
        kind: _per_run(t, totals["idle"], runs) for kind, t in totals.items() if kind != "idle"
    }
    return window, totals, per_run


def measure_counts(lab: Lab, runs: int, k: int, timeout_s: float, settle_s: float) -> Section:
    """Section 2 (see the module docstring)."""
    section = Section(
        "counts",
        f"2. Server-counted work per model step (private Postgres and Redis; "
        f"{runs} runs per agent, k = {k})",
    )
    notes: list[str] = []
    groups = _setup(lab, k)
    window, totals, per_run = measure(lab, groups, runs, timeout_s, settle_s, notes)
    rows = {
        "read_step": scaled(per_run["reads"], per_run["final"], k),
        "write_step": scaled(per_run["writes"], per_run["final"], k),
        "run": per_run["five"],
        "run_step": scaled(per_run["five"], None, agents.MODEL_STEPS),
        "fixed": per_run["final"],
    }
    names = {
        "read_step": "read-only step",
        "write_step": "step with one write",
        "run": "5-step run (5 calls, 2 writes)",
        "run_step": "5-step run / 5 steps",
        "fixed": "one-step run (fixed cost)",
    }
    section.matrix = (
        ["per", *[SHORT[m] for m in METRICS]],
        [[names[r], *[f"{v[m]:.2f}" for m in METRICS]] for r, v in rows.items()],
    )
    for r, values in rows.items():
        for m in METRICS:
            target = (
                READ_STEP.get(m)
                if r == "read_step"
                else RUN_ROW_WRITES
                if (r, m) == ("run", "row_writes")
                else None
            )
            label = f"{names[r]}: {LABELS[m]}"
            section.figures.append(
                Figure(f"{r}_{m}", label, values[m], "", target, hidden=target is None)
            )
    section.detail = {
        "method": __doc__,
        "runs_per_agent": runs,
        "k": k,
        "window_s": round(window, 2),
        "notes": notes,
        "per_run": per_run,
        "per_step": rows,
        "totals": totals,
        "scripts": {g.kind: g.steps for g in groups},
    }
    return section


def _check_succeeded(groups: list[Group]) -> None:
    """Every counted run succeeded (read after the window closed)."""
    for g in groups:
        if not g.ids:
            continue
        engine = sa.create_engine(g.database_url, poolclass=NullPool, hide_parameters=True)
        try:
            with engine.connect() as conn:
                bad = conn.execute(
                    sa.text(
                        "SELECT count(*) FROM runs "
                        "WHERE id = ANY(CAST(:ids AS uuid[])) AND status <> 'succeeded'"
                    ),
                    {"ids": g.ids},
                ).scalar()
        finally:
            engine.dispose()
        if bad:
            raise BenchError(
                f"counts/{g.kind}: {bad} of {len(g.ids)} runs did not succeed; "
                "the counts would mislead"
            )
