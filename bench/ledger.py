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

from collections.abc import Callable
from dataclasses import replace

from bench import agents, counts
from bench.counts import METRICS, SHORT, Group
from bench.lab import Lab
from bench.report import Figure, Section, Target
from runtime.base.settings import Settings
from runtime.models import prices

# The simulators' models are `script-<digest>`: priced as `script`.
PRICES = prices.as_setting({"script": {"input": 3, "output": 15}})
READ_STEP = {"write_statements": Target("<=", 1), "pg_round_trips": Target("<=", 3)}


def _setup(lab: Lab, k: int) -> list[Group]:
    def ledger(on: bool) -> Callable[[Settings], Settings]:
        return lambda s: replace(s, model_prices=PRICES, usage_ledger=on)

    return counts.groups_of(
        lab,
        "ledger",
        {
            "idle": (None, ledger(True)),
            "final/on": (agents.only_final(), ledger(True)),
            "reads/on": (agents.reads(k), ledger(True)),
            "final/off": (agents.only_final(), ledger(False)),
            "reads/off": (agents.reads(k), ledger(False)),
        },
    )


def measure_ledger(lab: Lab, runs: int, k: int, timeout_s: float, settle_s: float) -> Section:
    """The ledger section (see the module docstring)."""
    section = Section(
        "ledger",
        f"Usage ledger on vs off: server-counted work per model step ({runs} runs per agent, "
        f"k = {k})",
    )
    notes: list[str] = []
    window, totals, per_run = counts.measure(lab, _setup(lab, k), runs, timeout_s, settle_s, notes)
    rows = {
        side: counts.scaled(per_run[f"reads/{side}"], per_run[f"final/{side}"], k)
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
