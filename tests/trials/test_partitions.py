"""Partitions: a worker in a network namespace of its own (tests/support/netns.py) is cut
from everything, from Redis only, or from Postgres only, under runs in flight with write tools,
on the product's own timings (lease 8 s, heartbeat 2.6 s, sweep 3 s). Judged from Postgres
and the vendors' own records: 0 lost, 0 duplicate, 0 stale writes; the cut worker's runs are
claimed by a survivor within 12 s of the cut, and no request of the cut attempt reaches a
vendor after its claim (the simulator's request times against the claim's, one clock: both
are Postgres's). The cut worker never comes back: anything it did after its claim would show.

The cut from everything runs in `make test` (about 40 s); the other two in `make trials`
(LIYAGENT_PARTITION_TRIALS=1). Cut from Postgres only, the worker's probe sees it cannot
reach Postgres while the survivor does, and it gives its leases up for the survivor to claim
as store faults, no loss charged (runtime/fleet/heartbeat.py, `PostgresReach`)."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from datetime import datetime
from typing import Any

import pytest
import sqlalchemy as sa

from liyagent.local import sim_model
from runtime.base.settings import Timings
from tests.support import netns
from tests.support.judge import judge_runs, wait_all
from tests.support.scripts import mixed
from tests.support.stack import script_tools

pytestmark = pytest.mark.kill

CLAIM_BOUND_S = 12.0
# Long enough per model step that the cut worker's runs are in flight at the cut.
LATENCY_MS = 3000
FULL = bool(os.environ.get("LIYAGENT_PARTITION_TRIALS"))


def _address(url: str, default_port: int) -> tuple[str, int]:
    u = sa.make_url(url.replace("redis://", "postgresql://"))
    return u.host or "127.0.0.1", u.port or default_port


@pytest.fixture
def namespace_(stack) -> Iterator[netns.Namespace]:
    why = netns.available()
    if why is not None:
        if os.environ.get("LIYAGENT_CI"):
            pytest.fail(why)
        pytest.skip(why)
    stack.reconfigure(timings=Timings())  # the product's own lease, heartbeat and sweep
    sim = sa.make_url(stack.sim_url.replace("http://", "postgresql://"))
    ns = netns.Namespace(
        {
            "redis": _address(stack.settings.redis_url, 6379),
            "postgres": _address(stack.settings.database_url, 5432),
            "vendors": (sim.host or "127.0.0.1", sim.port or 80),
        }
    ).open()
    try:
        yield ns
    finally:
        stack.close()  # the workers first, the namespaced one with them
        ns.close()


# The simulators' model as every worker reaches it: through the vendors' link, which the host
# reaches too while the namespace's end is down (a model profile of the deployment).
NS_MODEL = "sim-ns"


def _relayed_env(stack, ns: netns.Namespace) -> dict[str, str]:
    """The namespaced worker's settings: every store and vendor through its own links."""
    rhost, rport = ns.address("redis")
    phost, pport = ns.address("postgres")
    vhost, vport = ns.address("vendors")
    redis_url = sa.make_url(stack.settings.redis_url.replace("redis://", "postgresql://"))
    db = f"/{redis_url.database}" if redis_url.database else ""
    database_url = sa.make_url(stack.settings.database_url).set(host=phost, port=pport)
    return {
        "LIYAGENT_REDIS_URL": f"redis://{rhost}:{rport}{db}",
        "LIYAGENT_DATABASE_URL": database_url.render_as_string(hide_password=False),
        "LIYAGENT_VENDOR_URL": f"http://{vhost}:{vport}",
    }


def _start(stack, ns: netns.Namespace, tag: str) -> str:
    """A run whose model the namespaced worker reaches too: through the vendors' link, which
    the host reaches also while the namespace's end is down."""
    steps = mixed(tag, latency_ms=LATENCY_MS)
    model: dict[str, Any] = {**sim_model.register(stack.sim_url, steps), "profile": NS_MODEL}
    return stack.client.start_run(
        agent="support-bot", model=model, user_input="help", tools=script_tools(steps)
    )


def _until(check, what: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def _db_now(stack) -> datetime:
    return stack.rows("SELECT now() AS now_at")[0].now_at


def _partition_trial(stack, ns: netns.Namespace, paths: tuple[str, ...], figures) -> None:
    vhost, vport = ns.address("vendors")
    stack.declare_model(NS_MODEL, "openai", f"http://{vhost}:{vport}/v1", sim_model.KEY_ENV)
    stack.worker("cut", wrap=ns.argv, env=_relayed_env(stack, ns))
    cut_runs = [_start(stack, ns, f"cut{i}") for i in range(2)]
    _until(
        lambda: all(stack.client.get(r).status == "running" for r in cut_runs),
        "the namespaced worker never ran its runs",
    )
    stack.worker("survivor")
    others = [stack.start(mixed(f"live{i}", latency_ms=LATENCY_MS)) for i in range(2)]
    _until(
        lambda: all(stack.client.get(r).step >= 1 for r in cut_runs),
        "the cut worker's runs never got going",
    )
    assert all(stack.client.get(r).status == "running" for r in cut_runs), "ended too soon"
    cut_at = _db_now(stack)  # read before the cut: the bound is measured no shorter
    ns.cut(*paths)
    runs = [*cut_runs, *others]
    wait_all(stack, runs, timeout=120)

    verdict = judge_runs(stack, runs)
    verdict.assert_clean()  # all succeeded, 0 duplicate, 0 stale (Postgres and the vendors)
    took: list[float] = []
    for run_id in cut_runs:
        claims = stack.rows(
            "SELECT kind, attempt, created_at FROM audit_events WHERE run_id = :r "
            "AND kind IN ('agent.run.lost', 'agent.run.store_fault') ORDER BY id",
            r=run_id,
        )
        assert claims, f"run {run_id}: the cut worker's run was never claimed"
        claimed_at = claims[0].created_at
        took.append((claimed_at - cut_at).total_seconds())
        # Any request of the cut attempt (attempt 1: the model's and the tools') that reached
        # a vendor after the claim, by the simulator's own record.
        late = stack.vendor(
            "SELECT count(*) AS n FROM sim.requests WHERE run_id = :r AND attempt = 1 "
            "AND created_at > :t",
            r=run_id,
            t=claimed_at,
        )[0].n
        assert late == 0, f"run {run_id}: {late} requests of the cut attempt after its claim"
    figures.append(
        f"partition ({'+'.join(paths)} cut): {len(cut_runs)} runs claimed "
        f"{', '.join(f'{t:.1f}' for t in took)} s after the cut (bound {CLAIM_BOUND_S:.0f} s), "
        f"losses {verdict.losses}"
    )
    assert max(took) <= CLAIM_BOUND_S, f"claimed {max(took):.1f} s after the cut"


def test_a_worker_cut_from_everything_has_its_runs_claimed_by_a_survivor(
    stack, namespace_, publish_figures
) -> None:
    _partition_trial(stack, namespace_, netns.PATHS, publish_figures)


@pytest.mark.skipif(not FULL, reason="make trials (LIYAGENT_PARTITION_TRIALS=1)")
def test_a_worker_cut_from_redis_only_has_its_runs_claimed_by_a_survivor(
    stack, namespace_, publish_figures
) -> None:
    _partition_trial(stack, namespace_, ("redis",), publish_figures)


@pytest.mark.skipif(not FULL, reason="make trials (LIYAGENT_PARTITION_TRIALS=1)")
def test_a_worker_cut_from_postgres_only_has_its_runs_claimed_by_a_survivor(
    stack, namespace_, publish_figures
) -> None:
    _partition_trial(stack, namespace_, ("postgres",), publish_figures)
