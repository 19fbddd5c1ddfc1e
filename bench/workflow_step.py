"""`make bench` section `workflows` (`python -m bench --only workflows`): what a step of a Python
workflow costs beside an agent's read-only step (issue 36: at most 1 ms more), and how soon a
Stop cuts a request in flight (bench/stop_cut.py).

Method: one liyagent worker (`-c 2`) over the lab's Postgres and Redis, loading the bench's
workflow (bench/flows.py). Runs go one at a time, each timed by Postgres itself (its run's
`finished_at - started_at`, no queueing): agents of k read-only steps and of the answer alone
(the simulators' model at 0 ms), workflows of k read steps and of none; a step is the
difference of the medians over k. Both make the same declared read (`ticket.read`) against the
same simulator; an agent step also asks the model (one local HTTP request), a workflow step
records its step instead (its own record, written before the call, as an agent step's is).
The simulators record each request they answer in Postgres too, so both sides pay that alike;
where an engine step's statements go is the `counts` section's.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import replace

import sqlalchemy as sa
from sqlalchemy.pool import NullPool

from bench import agents, stop_cut
from bench.lab import Lab
from bench.report import Figure, Section, Target
from bench.sides import LiyagentSide, wait_ended
from bench.stop_cut import measure_stop_cut
from liyagent.local import sim_model

FLOWS = "bench.flows"
ADDED_MS = 1.0


def _timed(engine: sa.Engine, run_id: str) -> float:
    """The run's duration by Postgres (ms); RuntimeError unless it succeeded."""
    with engine.connect() as conn:
        row = conn.execute(
            sa.text(
                "SELECT status, EXTRACT(EPOCH FROM finished_at - started_at) * 1000 AS ms "
                "FROM runs WHERE id = CAST(:r AS uuid)"
            ),
            {"r": run_id},
        ).one()
    if row.status != "succeeded":
        raise RuntimeError(f"bench run {run_id} ended {row.status}")
    return float(row.ms)


def measure_workflow_step(lab: Lab, runs: int, k: int, timeout_s: float) -> Section:
    """The workflows section (see the module docstring)."""
    db = lab.database("bench_workflows")
    settings = replace(lab.settings(db), tool_modules=(*sim_model.TOOLS, FLOWS))
    [worker] = lab.launch(lab.liyagent("workflows", settings))
    side = LiyagentSide(settings, lab.seal_keys)
    engine = sa.create_engine(db, poolclass=NullPool, hide_parameters=True)

    def one(start: Callable[[], str]) -> float:
        run_id = start()
        wait_ended(side, [run_id], timeout_s)
        return _timed(engine, run_id)

    def agent(steps: agents.Steps) -> Callable[[], str]:
        return lambda: side.start(steps)

    def flow(n: int) -> Callable[[], str]:
        return lambda: str(side.client.start_workflow(workflow="bench.reads", params={"k": n}))

    kinds = {
        "agent_reads": agent(agents.reads(k)),
        "agent_final": agent(agents.only_final()),
        "flow_reads": flow(k),
        "flow_none": flow(0),
    }
    for start in kinds.values():  # warm every path once
        one(start)
    taken: dict[str, list[float]] = {name: [] for name in kinds}
    for _ in range(runs):  # interleaved, so a slow moment lands on every kind alike
        for name, start in kinds.items():
            taken[name].append(one(start))
    lab.stop(worker)
    ms = {n: statistics.median(v) for n, v in taken.items()}
    agent_ms = (ms["agent_reads"] - ms["agent_final"]) / k
    flow_ms = (ms["flow_reads"] - ms["flow_none"]) / k
    section = Section(
        "workflows",
        f"A Python workflow's step beside an agent's read-only step ({runs} runs each, k = {k}); "
        "a Stop's cut of a request in flight",
    )
    section.figures = [
        Figure("agent_step_ms", "agent read-only step (model asked, read made)", agent_ms, "ms"),
        Figure("workflow_step_ms", "workflow read step (recorded, read made)", flow_ms, "ms"),
        Figure(
            "workflow_added_ms",
            "workflow step minus agent step",
            flow_ms - agent_ms,
            "ms",
            Target("<=", ADDED_MS),
        ),
    ]
    section.figures += measure_stop_cut(lab, runs, timeout_s)
    section.detail = {
        "method": __doc__,
        "stops": stop_cut.__doc__,
        "runs": runs,
        "k": k,
        "median_ms": ms,
    }
    return section
