"""Rolling deploys with runs in flight (issue 35's trials): real workers running the old code
(tests/support/deploy_code.py, `deploy_desk`: a native, a Pydantic AI and an Agents SDK agent,
each pinned and following the latest, over the order desk) replaced one by one by workers of
the new code, surge first: a new worker started, then an old one SIGTERMed (its warm shutdown
hands its runs back at their next step boundary). One case per change the new code makes; for
a newer record format (a newer liyagent release), a canary of it is started and stopped first,
so old workers meet its records.

Judged from the model server's records (what each run's model was offered and told) and the
order desk's (tests/support/deploy_judge.py): every run ends as its policy says (a change the
new code serves, or a prompt: succeeded; pinned to what the new code does not serve: served by
an old worker while one lived, or failed with `definition_drift` after its wait; following the
latest: succeeded, re-pinned, audited); 0 lost, 0 written twice, 0 steps asked again, 0 runs on
a mix of definitions, 0 pinned runs without a tool they were pinned to, every drift audited.

`make trials`: every change, LIYAGENT_DEPLOY_RUNS=54 (LIYAGENT_DEPLOY_CHANGES=all), figures to
LIYAGENT_FIGURES_REPORT. `make test` runs the short version: the prompt changed and a tool
removed, 6 runs each (each test process has a Postgres of its own, tests/conftest.py).
"""

from __future__ import annotations

import os
import sys
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from liyagent.local.procs import Proc
from runtime.services import holder_of
from store.runs import db_now
from tests.support import deploy_code as code
from tests.support.deploy_code import Change
from tests.support.deploy_judge import judge_deploy, p50, records, references
from tests.support.order_desk import ORDER_DESK, Desk, start_desk, with_path
from tests.support.stack import Stack

pytestmark = pytest.mark.kill

RUNS = int(os.environ.get("LIYAGENT_DEPLOY_RUNS") or 6)
_CHOSEN = os.environ.get("LIYAGENT_DEPLOY_CHANGES") or "prompt,removed"
CHANGES = list(Change) if _CHOSEN == "all" else [Change(c) for c in _CHOSEN.split(",")]
# What the new code serves of a run pinned to the old: everything but a changed tool set,
# tool kind, argument schema or output type.
SERVABLE = {Change.PROMPT, Change.BODY, Change.FORMAT}
WORKERS = 3 if RUNS > 12 else 2
# Each worker's threads: all runs of the short version at once; half of the long one's (the
# rest queued, taken by whichever workers live then).
SLOTS = max(3, -(-RUNS // WORKERS) if RUNS <= 12 else -(-RUNS // (2 * WORKERS)))
# A model step's latency: the short version's runs must outlast a new worker's start (the
# surge before the first SIGTERM), which took up to 30 s beside the whole suite on a loaded
# 2-core machine.
LATENCY_MS = 2000 if RUNS > 12 else 8000
WAIT_S = 8  # every worker's LIYAGENT_DEFINITION_WAIT_S
KINDS = tuple(code.MODEL_ENV)


@dataclass
class Deployment:
    """The two versions side by side, the desk, and what a worker of each is started with."""

    desk: Desk
    old: dict[str, str]
    new: dict[str, str]


@pytest.fixture
def deployment(
    stack: Stack, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest
) -> Iterator[Deployment]:
    change: Change = request.node.callspec.params["change"]
    desk = start_desk(tmp_path, with_path(dict(os.environ), ORDER_DESK))
    for kind, env in code.MODEL_ENV.items():
        monkeypatch.setenv(env, stack.model(code.script(kind, LATENCY_MS))["model"])
    monkeypatch.setenv(code.BASE_URL_ENV, f"{stack.sim_url}/v1")
    monkeypatch.setenv("ORDER_DESK_URL", desk.url)
    homes = {}
    for version, text in (("old", code.source(None)), ("new", code.source(change))):
        homes[version] = tmp_path / version
        homes[version].mkdir()
        (homes[version] / f"{code.MODULE}.py").write_text(text)
    # This process starts the runs: their pins are the old code's.
    monkeypatch.syspath_prepend(str(homes["old"]))
    stack.reconfigure(tool_modules=(code.MODULE,))

    def env(version: str) -> dict[str, str]:
        path = os.pathsep.join([str(homes[version]), os.environ.get("PYTHONPATH", "")])
        return {"PYTHONPATH": path, "LIYAGENT_DEFINITION_WAIT_S": str(WAIT_S)}

    yield Deployment(desk, env("old"), env("new"))
    desk.proc.kill()
    sys.modules.pop(code.MODULE, None)


def _worker(stack: Stack, name: str, env: dict[str, str]) -> Proc:
    return stack.worker(name, env=env, pool="threads", concurrency=SLOTS)


def _start_runs(stack: Stack) -> dict[str, tuple[str, str]]:
    """RUNS runs over the three agents and both policies, in turn; id -> (agent, policy)."""
    runs = {}
    for i in range(RUNS):
        kind, policy = KINDS[i % 3], code.POLICIES[(i // 3) % 2]
        agent = code.agent_name(kind, policy)
        runs[stack.client.start_agent(agent, f"{code.ORDER} arrived broken ({i})")] = (
            agent,
            policy,
        )
    return runs


def _ended(stack: Stack, runs: dict[str, tuple[str, str]]) -> int:
    rows = stack.rows(
        "SELECT count(*) AS n FROM runs WHERE id = ANY(CAST(:ids AS uuid[])) "
        "AND status IN ('succeeded', 'failed')",
        ids=list(runs),
    )
    return int(rows[0].n)


def _until_every_agent_is_going(stack: Stack, runs: dict[str, tuple[str, str]]) -> None:
    """Until every agent has a run that took a step (so the old code's definitions are on the
    model server's record before any new worker starts)."""
    deadline = time.monotonic() + 90
    while True:
        going = stack.rows(
            "SELECT DISTINCT agent FROM runs WHERE id = ANY(CAST(:ids AS uuid[])) AND step >= 1",
            ids=list(runs),
        )
        if len(going) == len({a for a, _ in runs.values()}):
            return
        assert time.monotonic() < deadline, f"only {[g.agent for g in going]} got going"
        time.sleep(0.1)


def _until_all_end(stack: Stack, runs: dict[str, tuple[str, str]], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while _ended(stack, runs) < len(runs) and time.monotonic() < deadline:
        time.sleep(0.25)


def _canary(stack: Stack, deployment: Deployment, runs: dict[str, tuple[str, str]]) -> int:
    """A canary of the new release, stopped once it wrote a step of a run (of the newer
    format): the old workers, all still up, then meet its runs' records. Without it no old
    worker would (a surge deploy never stops a new worker). The runs in flight at its stop."""
    canary = _worker(stack, "canary", deployment.new)
    holder = holder_of(canary.popen.pid)  # its one process (a threads worker)
    deadline = time.monotonic() + 60
    while not stack.rows(
        "SELECT 1 FROM runs WHERE claimed_by = :h AND checkpoint_attempt = attempt AND step >= 1",
        h=holder,
    ):
        assert time.monotonic() < deadline, "the canary never wrote a step"
        time.sleep(0.1)
    in_flight = len(runs) - _ended(stack, runs)
    canary.stop(grace_s=60)
    return in_flight


@pytest.mark.timeout(300 + RUNS * 6)
@pytest.mark.parametrize("change", CHANGES, ids=[c.value for c in CHANGES])
def test_a_rolling_deploy_keeps_each_run_on_its_definition(
    change: Change, stack: Stack, deployment: Deployment, publish_figures: list[str]
) -> None:
    began = time.monotonic()
    olds = [_worker(stack, f"old{i}", deployment.old) for i in range(WORKERS)]
    runs = _start_runs(stack)
    _until_every_agent_is_going(stack, runs)
    # The rolling deploy, surge first: a new worker ready, then an old one SIGTERMed.
    deploy_began = time.monotonic()
    in_flight = [_canary(stack, deployment, runs)] if change is Change.FORMAT else []
    clean = []
    for i, old in enumerate(olds):
        _worker(stack, f"new{i}", deployment.new)
        in_flight.append(len(runs) - _ended(stack, runs))
        old.stop(grace_s=60)
        clean.append(old.popen.returncode == 0)
    with stack.db() as conn:
        old_gone_at = db_now(conn)
    deploy_s = time.monotonic() - deploy_began
    _until_all_end(stack, runs, timeout=WAIT_S * 4 + RUNS * 2 + 60)

    recs = records(stack, runs)
    servable = change in SERVABLE
    verdict = judge_deploy(recs, references(recs), deployment.desk, servable, old_gone_at)
    ends = Counter(
        f"{r.agent.removeprefix('deploy-')}:{r.status}"
        + (f"({r.failure_code})" if r.failure_code else "")
        for r in recs.values()
    )
    waits = [w for r in recs.values() if (w := r.drift_wait_s()) is not None]
    met_new = sum("new" in r.codes.values() for r in recs.values())
    publish_figures.append(
        f"rolling deploy, {change.value} changed: {len(runs)} runs, {WORKERS} workers "
        f"x{SLOTS} threads replaced in {deploy_s:.1f} s (in flight at each SIGTERM "
        f"{in_flight}, clean stops {sum(clean)}/{len(clean)}); {met_new} runs served by the "
        f"new code, {sum(r.handed_back for r in recs.values())} hand-backs, "
        f"{sum(r.repins for r in recs.values())} re-pins, {len(waits)} drift waits "
        f"(p50 {p50(waits)} s), {sum(r.newer_waits for r in recs.values())} on a newer "
        f"record; ends {dict(sorted(ends.items()))}; problems "
        f"{verdict.problems() or 'none'}; {time.monotonic() - began:.0f} s"
    )
    assert in_flight[0] >= min(RUNS, 50), f"too few runs in flight: {in_flight}"
    assert all(clean), f"an old worker did not stop by itself: {clean}"
    assert not verdict.problems(), verdict.problems()
    if change is Change.FORMAT:  # an old worker met a newer record and handed its run back
        assert any(r.newer_waits for r in recs.values()), "no old worker met a newer record"
