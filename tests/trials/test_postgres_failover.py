"""Postgres fails over under runs in flight: a private primary with a synchronous replica
(`pg_basebackup -R`), workers given both through one multi-host URL with
`target_session_attrs=read-write`; the primary's postmaster SIGKILLed, the replica promoted.
Judged from the new primary and the vendor simulator's records: no run lost, failed or
charged a loss, no write twice or after a give-back, and runs progress again within 10 s of
the promotion. A multi-host URL whose hosts are all read-only refuses to start, naming it."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime

import pytest
import sqlalchemy as sa

from liyagent.local.procs import ROOT
from liyagent.local.servers import PrivatePostgres
from runtime.base.settings import database_url as parsed_url
from store import migrate
from store.admin import create_database
from tests.support.judge import judge_runs, run_rows, until_in_flight, wait_all
from tests.support.scripts import mixed

LATENCY_MS = 500
RUNS = 10
# The promise: after the promotion, the fleet's runs move again within this (issue 19).
PROGRESS_BOUND_S = 10.0


@dataclass
class Pair:
    primary: PrivatePostgres
    replica: PrivatePostgres

    def url(self, *ports: int) -> str:
        """The one setting every process is given: libpq's multi-host form."""
        hosts = ",".join(f"127.0.0.1:{p}" for p in ports)
        return parsed_url(
            f"postgresql://postgres@{hosts}/liyagent_fault?target_session_attrs=read-write"
        )


@pytest.fixture
def pair(stack) -> Iterator[Pair]:
    primary = PrivatePostgres(settings={"synchronous_commit": "on"}).init()
    replica = PrivatePostgres()
    try:
        primary.start()
        create_database(primary.url, "liyagent_fault")
        pair = Pair(primary, replica)
        migrate.upgrade(pair.url(primary.port))
        replica.replica_of(primary).start()
        # Synchronous from now on: a commit the primary answered is on the replica too, so
        # nothing answered is lost with the primary. The replica's own settings were copied
        # before this, so once promoted it waits for no standby.
        admin = sa.create_engine(primary.url, isolation_level="AUTOCOMMIT", hide_parameters=True)
        with admin.connect() as conn:
            conn.execute(sa.text("ALTER SYSTEM SET synchronous_standby_names = '*'"))
            conn.execute(sa.text("SELECT pg_reload_conf()"))
            deadline = time.monotonic() + 30
            while (
                conn.execute(
                    sa.text("SELECT count(*) FROM pg_stat_replication WHERE sync_state = 'sync'")
                ).scalar_one()
                < 1
            ):
                assert time.monotonic() < deadline, "the replica never became synchronous"
                time.sleep(0.1)
        admin.dispose()
        yield pair
    finally:
        stack.close()  # the workers first, so none sees its database go at the end
        replica.remove()
        primary.remove()


def _first_progress_s(stack, runs: list[str], after: datetime) -> dict[str, float]:
    """For each run that had not ended by `after`: seconds from `after` to its first request
    at the model or a vendor (the simulator's own records)."""
    rows = stack.vendor(
        "SELECT run_id, min(created_at) AS at FROM sim.requests "
        "WHERE run_id = ANY(:ids) AND created_at > :after GROUP BY run_id",
        ids=runs,
        after=after,
    )
    return {r.run_id: (r.at - after).total_seconds() for r in rows}


@pytest.mark.kill
def test_postgres_fails_over_to_its_synchronous_replica_mid_run(
    stack, pair: Pair, publish_figures
) -> None:
    stack.reconfigure(database_url=pair.url(pair.primary.port, pair.replica.port))
    workers = [stack.worker("w1"), stack.worker("w2")]
    stack.beat()
    runs = [stack.start(mixed(f"p{i}", latency_ms=LATENCY_MS)) for i in range(RUNS)]
    until_in_flight(stack, runs, at_least=2)
    pair.primary.kill()  # SIGKILL the postmaster: every process's connections drop
    time.sleep(1.0)  # what a failover manager takes to decide, at the least
    pair.replica.promote()
    promoted_at = datetime.now(tz=UTC)
    wait_all(stack, runs, timeout=120)

    rows = run_rows(stack, runs)  # read from the new primary, through the same URL
    assert len(rows) == RUNS
    verdict = judge_runs(stack, runs)
    # All succeeded; 0 duplicate; 0 stale: nothing written by an attempt after its give-back.
    verdict.assert_clean()
    for r in rows:
        # Every worker process lived: no loss charged, no claim by the sweeper or the watch.
        assert r.status == "succeeded" and r.lost_count == 0 and r.claimed == 0, r
        assert r.attempt == 1 + r.store_faulted, r
    waiting = {r.id for r in rows if r.finished_at > promoted_at}
    progress = _first_progress_s(stack, runs, promoted_at)
    assert waiting <= set(progress), waiting - set(progress)
    slowest = max(progress[r] for r in waiting)
    given_back = sum(r.store_faulted for r in rows)
    # The held messages were tried again with a growing pause, not in a tight loop.
    requeued = sum(w.output().count("message.requeued") for w in workers)
    publish_figures.append(
        f"postgres failover (sync replica, promoted 1 s after the kill): {RUNS} runs, "
        f"{given_back} given back as store faults, losses charged 0, every run in flight "
        f"progressed within {slowest:.1f} s of the promotion, {requeued} messages requeued"
    )
    assert slowest <= PROGRESS_BOUND_S, progress
    assert requeued <= 2 * RUNS, requeued


def _start(argv: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", *argv], env=env, cwd=ROOT, capture_output=True, text=True, timeout=60
    )


def test_a_multi_host_url_whose_hosts_are_all_read_only_refuses_to_start(stack, pair) -> None:
    """Only the standby answers: the worker refuses to start and the CLI stops, both exit 3
    with the same sentence naming the hosts and the setting, and no traceback."""
    only_standbys = pair.url(pair.replica.port, pair.replica.port)
    env = {**stack.env, "LIYAGENT_DATABASE_URL": only_standbys}
    hosts = f"127.0.0.1:{pair.replica.port},127.0.0.1:{pair.replica.port}"
    for argv in (["celery", "-A", "tasks", "worker", "-c", "1"], ["liyagent", "status"]):
        done = _start(argv, env)
        assert done.returncode == 3, done.stderr[-2000:]
        assert "every host it names is read-only" in done.stderr, done.stderr[-2000:]
        assert "LIYAGENT_DATABASE_URL" in done.stderr and hosts in done.stderr
        assert "Traceback" not in done.stderr
