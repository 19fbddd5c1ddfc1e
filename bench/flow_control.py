"""The flowctl section: limits per model endpoint (issue 33), flow control on and off side by
side under the same offered load.

Each side: two real prefork workers `-c 4` over a fresh database on the bench's private
Postgres and a private Redis of its own (the product's timings); the simulators' model limits
input tokens as a provider does (LIMIT a minute: a bucket refilled continuously, a 429 with
Retry-After past it; simulators/token_limit.py), its bucket full at the start. On: the model
profile declares the same limit (runtime/flow/limits.py: one Redis script per request, a step
waits for capacity). Off: no limits declared; the fleet meets the provider's 429s and closes
the endpoint on each until its Retry-After (runtime/flow/gate.py), the step asked again.

Offered load (liyagent/local/token_load.py): a full bucket's worth of two-step runs at once,
then runs asking twice the limit a minute for OFFER_S seconds. Figures per side, from the model
server's own records: requests, 429s, input tokens answered per second (first request to last;
and past the provider's first bucket, against its refill of LIMIT / 60 a second) and as a share
of what the provider allowed over that span (its bucket, then its refill), runs done; Postgres
statement calls (pg_stat_statements, the side's database) and Redis commands (INFO commandstats
of the side's Redis, the broker's included) over the whole side, per run done.
"""

from __future__ import annotations

import time
from typing import Any

import httpx
import sqlalchemy as sa

from bench.lab import Lab, redis_client
from bench.report import Figure, Section, Target
from bench.sides import BenchError, LiyagentSide, wait_ended
from liyagent.local import sim_model
from liyagent.local.token_load import SCRIPT, Load, allowance

LIMIT = 24_000  # input tokens a minute, the provider's (and, on, the profile's)
OFFER_S = 30.0
SLOTS = 4
TARGETS = {
    "refused_share_on": Target("<=", 0.01, "issue 33"),
    "allowance_on": Target(">=", 0.95, "issue 33"),
}


def _counters(lab: Lab, database: str, redis_url: str) -> tuple[int, int]:
    """Statement calls on the side's database (pg_stat_statements) and commands its Redis ran
    (INFO commandstats, the INFO asking them left out)."""
    with lab.admin() as conn:
        calls = conn.execute(
            sa.text(
                "SELECT coalesce(sum(s.calls), 0) FROM pg_stat_statements s "
                "JOIN pg_database d ON d.oid = s.dbid WHERE d.datname = :db"
            ),
            {"db": database},
        ).scalar_one()
    client = redis_client(redis_url)
    try:
        stats = client.info("commandstats")
    finally:
        client.close()
    commands = sum(int(v["calls"]) for k, v in stats.items() if k != "cmdstat_info")
    return int(calls), commands


def _per_run(lab: Lab, sim: sa.Engine) -> int:
    """One load run's input tokens, as the model server counts them (asked with no limit)."""
    settings = lab.settings(lab.database("bench_flowctl_cal"))
    (worker,) = lab.launch(lab.liyagent("flowctl-calibrate", settings), concurrency=1)
    side = LiyagentSide(settings, lab.seal_keys)
    try:
        load = Load(side.client, sim_model.register(lab.sim_url, SCRIPT), LIMIT, per_run=1)
        run = load.start_one("calibration")
        wait_ended(side, [run], timeout_s=60)
    finally:
        side.close()
        lab.stop(worker)
    with sim.connect() as conn:
        return int(
            conn.execute(
                sa.text("SELECT sum(prompt_tokens) FROM sim.requests WHERE run_id = :r"),
                {"r": run},
            ).scalar_one()
        )


def one_side(lab: Lab, sim: sa.Engine, on: bool, per_run: int, offer_s: float) -> dict[str, Any]:
    """The offered load against the limited model, flow control `on` or off; its figures."""
    tag = "on" if on else "off"
    redis_url = lab.new_redis()
    db_url = lab.database("bench_flowctl")
    limits = {"input_tokens_per_minute": LIMIT} if on else None
    settings = lab.settings(
        db_url, redis_url, model_profiles=sim_model.profiles(lab.sim_url, limits)
    )
    workers = lab.launch(
        lab.liyagent(f"flowctl-{tag}-1", settings),
        lab.liyagent(f"flowctl-{tag}-2", settings),
        concurrency=SLOTS,
    )
    side = LiyagentSide(settings, lab.seal_keys)
    database = str(sa.make_url(db_url).database)
    limit = {"input_tokens": LIMIT, "window_s": 60}
    try:
        load = Load(side.client, sim_model.register(lab.sim_url, SCRIPT), LIMIT, per_run)
        before = _counters(lab, database, redis_url)
        httpx.post(f"{lab.sim_url}/sim/model/limit", json=limit, timeout=10).raise_for_status()
        offering = load.offer()
        time.sleep(offer_s)
        load.stop.set()
        offering.join()
        wait_ended(side, load.runs, timeout_s=300 + offer_s * 4)
        failed = side.failed(load.runs)
        after = _counters(lab, database, redis_url)
    finally:
        httpx.delete(f"{lab.sim_url}/sim/model/limit", timeout=10)
        side.close()
        lab.stop(*workers)
    with sim.connect() as conn:
        sent = conn.execute(
            sa.text(
                "SELECT status, prompt_tokens, created_at FROM sim.requests WHERE vendor = "
                "'model' AND method = 'POST' AND run_id = ANY(:runs) ORDER BY created_at"
            ),
            {"runs": load.runs},
        ).all()
    if not sent:
        raise BenchError(f"flowctl {tag}: the model was never asked")
    answered, allowed, span = allowance(sent, LIMIT)
    done = len(load.runs) - len(failed)
    refused = sum(1 for r in sent if r.status == 429)
    return {
        "runs": len(load.runs),
        "runs_done": done,
        "requests": len(sent),
        "refused": refused,
        "refused_share": refused / len(sent),
        "tokens_per_s": answered / span if span else 0.0,
        "refill_per_s": (answered - LIMIT) / span if span else 0.0,
        "allowance": answered / allowed,
        "span_s": span,
        "pg_statements_per_run": (after[0] - before[0]) / max(1, done),
        "redis_commands_per_run": (after[1] - before[1]) / max(1, done),
    }


LABELS = {
    "requests": ("model requests", ""),
    "refused": ("429s answered", ""),
    "refused_share": ("429s / requests", ""),
    "tokens_per_s": ("input tokens answered per second", "tok/s"),
    "refill_per_s": (f"of them past the first bucket (its refill: {LIMIT // 60}/s)", "tok/s"),
    "allowance": ("answered / the provider's allowance over the span", ""),
    "runs_done": ("runs done", ""),
    "pg_statements_per_run": ("Postgres statement calls per run", ""),
    "redis_commands_per_run": ("Redis commands per run", ""),
}


def measure_flow_control(lab: Lab, offer_s: float = OFFER_S) -> Section:
    """The flowctl section (see the module docstring)."""
    section = Section(
        "flowctl",
        f"Limits per model endpoint: {LIMIT} input tokens a minute, offered 2x for "
        f"{offer_s:g} s, 2 workers -c {SLOTS}; on (profile limits) vs off (429s close it)",
    )
    sim = sa.create_engine(lab.sim_db_url, hide_parameters=True)
    try:
        per_run = _per_run(lab, sim)
        sides = {tag: one_side(lab, sim, tag == "on", per_run, offer_s) for tag in ("on", "off")}
    finally:
        sim.dispose()
    for key, (label, unit) in LABELS.items():
        for tag, figures in sides.items():
            section.figures.append(
                Figure(
                    f"{key}_{tag}",
                    f"flow control {tag}: {label}",
                    float(figures[key]),
                    unit,
                    TARGETS.get(f"{key}_{tag}"),
                    digits=3 if key in ("refused_share", "allowance") else 1,
                )
            )
    section.detail = {"method": __doc__, "sides": sides, "per_run_tokens": per_run}
    return section
