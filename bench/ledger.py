"""The ledger section (issue 34): Postgres and Redis work per model step with the usage ledger
on (the default: a step's cost written with it, a reservation noted in Redis before each model
request) and off (LIYAGENT_USAGE_LEDGER=false: tokens still written with their step, nothing
else), counted by the servers themselves, side by side.

Method: section 2's (bench/counts.py), on five groups at once, each with its own engine
database, private Redis, counting proxies and liyagent worker (`-c 2`, 0 ms model latency, a
price table that prices the simulators' models, so the ledger's cost is computed):

  idle       no runs: the control
  final/on   R one-step runs (only the answer), ledger on;  final/off  the same, ledger off
  reads/on   R runs of k read-only steps then the answer, ledger on;  reads/off  ledger off

A read-only step = (reads - final) / k, per side; its write statements, Postgres round trips,
Redis round trips and commands are the servers' counts (pg_stat_statements, the wire proxies,
INFO commandstats). The ledger writes no statement of its own: a step's tokens and cost ride
the statement that writes the step, an unconfirmed reservation the claim of a loss (none here).
"""

from __future__ import annotations

import time
from dataclasses import replace

import sqlalchemy as sa

from bench import agents, counts
from bench.counts import METRICS, SHORT, Group
from bench.lab import Lab
from bench.report import Figure, Section, Target
from bench.sides import LiyagentSide
from bench.wire import CountingProxy
from runtime.models import prices

# The simulators' models are `script-<digest>`: priced as `script`.
PRICES = prices.as_setting({"script": {"input": 3, "output": 15}})
READ_STEP = {"write_statements": Target("<=", 1), "pg_round_trips": Target("<=", 3)}


def _setup(lab: Lab, k: int) -> list[Group]:
    kinds: dict[str, tuple[agents.Steps | None, bool]] = {
        "idle": (None, True),
        "final/on": (agents.only_final(), True),
        "reads/on": (agents.reads(k), True),
        "final/off": (agents.only_final(), False),
        "reads/off": (agents.reads(k), False),
    }
    groups = []
    for kind, (steps, on) in kinds.items():
        tag = kind.replace("/", "_")
        db, rd = lab.database(f"bench_ledger_{tag}"), lab.new_redis()
        pg_url, redis_url = sa.make_url(db), sa.make_url(rd.replace("redis://", "postgresql://"))
        pg_proxy = CountingProxy(pg_url.host or "127.0.0.1", pg_url.port or 5432, postgres=True)
        redis_proxy = CountingProxy(redis_url.host or "127.0.0.1", redis_url.port or 6379)
        proxied_db = pg_url.set(port=pg_proxy.port).render_as_string(hide_password=False)
        settings = replace(
            lab.settings(proxied_db, f"redis://127.0.0.1:{redis_proxy.port}/0"),
            model_prices=PRICES,
            usage_ledger=on,
        )
        groups.append(Group(kind, steps, db, rd, pg_proxy, redis_proxy, settings))
    procs = lab.launch(
        *[lab.liyagent(f"ledger-{g.kind.replace('/', '-')}", g.settings) for g in groups]
    )
    for g, proc in zip(groups, procs, strict=True):
        g.worker = proc
        g.side = LiyagentSide(g.settings, lab.seal_keys)
    return groups


def measure_ledger(lab: Lab, runs: int, k: int, timeout_s: float, settle_s: float) -> Section:
    """The ledger section (see the module docstring)."""
    section = Section(
        "ledger",
        f"Usage ledger on vs off: server-counted work per model step ({runs} runs per agent, "
        f"k = {k})",
    )
    groups = _setup(lab, k)
    dbs = [g.database for g in groups]
    notes: list[str] = []
    try:
        counts._warm(groups, timeout_s)
        if not counts._settled(lab, dbs, settle_s):
            notes.append("a backend stayed busy: Postgres's counters may lag")
        with lab.admin() as conn:
            conn.execute(sa.text("SELECT pg_stat_statements_reset()"))
        tuples_before = {g.database: counts._tuples(g.database_url) for g in groups}
        counts._flushed_or_note(lab, dbs, notes, settle_s)
        before = counts._server_counters(lab, groups)
        before.tuples = tuples_before
        window = time.monotonic()
        for _ in range(runs):
            for g in groups:
                if g.steps is not None and g.side is not None:
                    g.ids.append(g.side.start(g.steps))
        counts._wait_answered(lab, groups, timeout_s)
    finally:
        for g in groups:
            if g.side is not None:
                g.side.close()
        lab.stop(*[g.worker for g in groups if g.worker is not None])
        for g in groups:
            g.pg_proxy.close()
            g.redis_proxy.close()
    window = time.monotonic() - window
    if not counts._gone(lab, dbs):
        notes.append("a backend stayed connected after the workers stopped")
    after = counts._server_counters(lab, groups)
    after.tuples = {g.database: counts._tuples(g.database_url) for g in groups}
    counts._check_succeeded(groups)
    totals = {g.kind: counts._delta(before, after, g) for g in groups}
    per_run = {
        kind: counts._per_run(t, totals["idle"], runs)
        for kind, t in totals.items()
        if kind != "idle"
    }
    rows = {
        side: counts._scaled(per_run[f"reads/{side}"], per_run[f"final/{side}"], k)
        for side in ("on", "off")
    }
    section.matrix = (
        ["read-only step, ledger", *[SHORT[m] for m in METRICS]],
        [[side, *[f"{v[m]:.2f}" for m in METRICS]] for side, v in rows.items()],
    )
    for side, values in rows.items():
        for m in METRICS:
            target = READ_STEP.get(m)
            section.figures.append(
                Figure(
                    f"read_step_{side}_{m}",
                    f"read-only step, ledger {side}: {counts.LABELS[m]}",
                    values[m],
                    "",
                    target,
                    hidden=target is None and m not in ("redis_round_trips", "redis_commands"),
                )
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
    }
    return section
