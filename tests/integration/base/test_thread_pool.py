"""Hundreds of runs per process: a `-P threads` worker holds many runs in one process, so its
connection pools are sized from its concurrency and bounded, no run holds a connection while
it waits on the model, a worker Postgres cannot serve refuses to start with the numbers, and a
SIGKILL that loses every run the process held at once loses none of them (judged from Postgres
and the simulator's records)."""

from __future__ import annotations

import os
import signal
import statistics
import subprocess
import threading
import time
from datetime import UTC, datetime

import pytest

from liyagent.local.cluster import worker_argv
from liyagent.local.judge import claims, losses, resumed_at
from liyagent.local.servers import PrivatePostgres
from runtime.base import pools
from runtime.core import executor
from runtime.fleet.presence import connection_name
from runtime.services import holder_of
from store import db, migrate
from store.admin import create_database, database_url
from store.losses import claim_lost
from store.runs import claim_delivery
from tests.support.judge import judge_runs, wait_all
from tests.support.scripts import call, final, mixed, step

pytestmark = pytest.mark.kill

# Runs in flight in the pool tests, and a worker's thread count.
HELD = 30
THREADS = 40
# Runs one threads worker holds when it is killed (issue 18's mass loss, as many as the suite's
# budget and a shared Postgres of 100 connections fit), its threads and each worker's
# Postgres pool: its runs' statements take turns on it, as a large -c's would in production.
MASS_HELD = 150
MASS_THREADS = 160
MASS_DB_POOL = "12"


def _until(check, what: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, what
        time.sleep(0.1)


def _held_by(stack, runs: list[str], holder: str) -> int:
    return stack.rows(
        "SELECT count(*) AS n FROM runs WHERE id = ANY(CAST(:ids AS uuid[])) "
        "AND status = 'running' AND claimed_by = :h",
        ids=runs,
        h=holder,
    )[0].n


def _held_long(tag: str) -> list[dict]:
    """`mixed` with a first model step long enough that no run ends (and leaves the victim)
    before the last of them is started and claimed, however loaded the machine is."""
    script = mixed(tag, latency_ms=1000)
    return [{**script[0], "latency_ms": 20_000}, *script[1:]]


def test_a_killed_threads_worker_loses_none_of_the_hundred_and_fifty_runs_it_held(
    stack, publish_figures: list[str]
) -> None:
    # The survivor is up first, on the queue the death watch publishes recovered runs to (no
    # beat: its death watch is what recovers them, in batches); the victim alone consumes the
    # queue the runs start on, so it holds all of them.
    pool = {"LIYAGENT_DB_POOL_MAX": MASS_DB_POOL}
    stack.worker("survivor", pool="threads", concurrency=MASS_THREADS, env=pool)
    stack.reconfigure(queue=f"{stack.settings.queue}.victim")
    victim = stack.worker("victim", pool="threads", concurrency=MASS_THREADS, env=pool)
    holder = holder_of(victim.popen.pid)
    runs = [stack.start(_held_long(f"t{i}")) for i in range(MASS_HELD)]
    try:
        _until(lambda: _held_by(stack, runs, holder) == MASS_HELD, "", timeout=90)
    except AssertionError:
        where = stack.rows(
            "SELECT status, claimed_by, count(*) AS n FROM runs "
            "WHERE id = ANY(CAST(:ids AS uuid[])) GROUP BY 1, 2",
            ids=runs,
        )
        raise AssertionError(
            f"the victim ({holder}) never held all {MASS_HELD} runs: {where}; its log: "
            f"{victim.output()[-3000:]}"
        ) from None
    (spread,) = stack.rows(
        "SELECT EXTRACT(EPOCH FROM max(claimed_at) - min(claimed_at)) AS s FROM runs "
        "WHERE id = ANY(CAST(:ids AS uuid[]))",
        ids=runs,
    )
    killed_at = datetime.now(tz=UTC)
    victim.kill()
    wait_all(stack, runs, timeout=180)

    judge_runs(stack, runs).assert_clean()  # 0 lost, 0 duplicates, nothing stale
    rows = stack.rows(
        "SELECT r.id, r.status, r.attempt, r.lost_count, "
        "(SELECT count(*) FROM audit_events a WHERE a.run_id = r.id "
        " AND a.kind = 'agent.run.lost') AS claimed, "
        "(SELECT count(*) FROM audit_events a WHERE a.run_id = r.id "
        " AND a.kind = 'agent.run.crash_resumed') AS resumed "
        "FROM runs r WHERE r.id = ANY(CAST(:ids AS uuid[]))",
        ids=runs,
    )
    for r in rows:
        assert (r.status, r.attempt, r.lost_count, r.claimed, r.resumed) == (
            "succeeded",
            2,
            1,
            1,
            1,
        ), r
    resumes = []
    with stack.engine.connect() as conn:
        for run_id, (loss,) in losses(conn, runs).items():
            at = resumed_at(loss, claims(conn, run_id))
            assert at is not None, f"run {run_id} was never resumed"
            resumes.append((at - killed_at).total_seconds())
    assert len(resumes) == MASS_HELD
    publish_figures.append(
        f"threads kill ({MASS_HELD} runs in one -P threads -c {MASS_THREADS} worker): kill to "
        f"resumed attempt p50 {statistics.median(resumes):.2f} s, max {max(resumes):.2f} s "
        f"(the victim took {float(spread.s):.1f} s to claim them all)"
    )


def test_a_stalled_threads_worker_writes_nothing_for_any_run_after_takeover(stack) -> None:
    # SIGSTOP at the third checkpoint stops the whole process with every run it holds (its
    # heartbeat and death watch too): each lease lapses, each run is taken over, and on
    # waking every one of its threads is fenced or refused by the send guard.
    victim = stack.worker("victim", pool="threads", concurrency=10, fault="after_checkpoint:stop:3")
    holder = holder_of(victim.popen.pid)
    runs = [stack.start(mixed(f"s{i}", latency_ms=300)) for i in range(5)]
    stopped = int(stack.fault_hit("victim").split()[1])
    assert stopped == victim.popen.pid  # one process: the whole worker stopped
    held = _held_by(stack, runs, holder)
    assert held >= 2, f"the stopped worker held {held} runs"
    stack.worker("survivor", pool="threads", concurrency=10)
    stack.beat()
    wait_all(stack, runs, timeout=90)
    os.kill(stopped, signal.SIGCONT)
    # Each stale attempt ends fenced out, or as an error when the pause broke its database
    # connection (a connect that timed out while stopped).
    _until(
        lambda: (
            sum(victim.output().count(f'"run.{end}"') for end in ("fenced_out", "error")) >= held
        ),
        f"not every one of the {held} stale attempts stopped on waking",
        timeout=30,
    )
    judge_runs(stack, runs).assert_clean()  # nothing written or sent after any takeover
    lost = stack.rows(
        "SELECT count(*) AS n FROM runs WHERE id = ANY(CAST(:ids AS uuid[])) AND lost_count = 1",
        ids=runs,
    )[0].n
    # Every loss is the victim's (the survivor lost none), and none it held was missed. A claim
    # the victim sent just before it stopped may commit after `held` was read, so the victim
    # can have lost more than `held`, never fewer.
    victims = stack.rows(
        "SELECT count(DISTINCT run_id) AS n FROM audit_events WHERE kind = 'agent.run.lost' "
        "AND run_id = ANY(CAST(:ids AS uuid[])) AND detail ->> 'lost_holder' = :h",
        ids=runs,
        h=holder,
    )[0].n
    assert lost == victims >= held


def test_an_attempt_that_fails_after_its_takeover_writes_no_audit(stack) -> None:
    # What a thread of a paused worker meets on waking when the pause broke its connection:
    # its attempt ends as an error, after another attempt took the run over (I3).
    run_id = stack.start(mixed("e"))  # no worker runs: it stays queued for the claims below
    with stack.db() as conn:
        claimed = claim_delivery(conn, run_id, 1, "stale-worker")
        assert claimed is not None
        assert claim_lost(conn, run_id, 1, loss_limit=2) is not None
    audits = "SELECT count(*) AS n FROM audit_events WHERE run_id = :r AND attempt = 1"
    before = stack.rows(audits, r=run_id)[0].n
    executor._audit_quietly(
        stack.services.engine,
        stack.services.changes,
        claimed.run,
        "agent.run.error",
        {"error": "x"},
    )
    assert stack.rows(audits, r=run_id)[0].n == before, "the taken-over attempt wrote audit"


def test_runs_waiting_on_the_model_hold_no_connection_each(stack) -> None:
    # Six connections for thirty runs in flight: each run holds one only inside a statement,
    # never while it waits on the model, or the others could not go on.
    pool_max = 6
    worker = stack.worker(
        "w1", pool="threads", concurrency=THREADS, env={"LIYAGENT_DB_POOL_MAX": str(pool_max)}
    )
    name = connection_name(holder_of(worker.popen.pid))
    script = [
        step(call("toolu_a", "ticket.read", ticket="T-1"), latency_ms=1500),
        step(call("toolu_b", "ticket.read", ticket="T-2"), latency_ms=1500),
        final("Read twice.", latency_ms=1500),
    ]
    peak, in_flight, done = [0], [0], threading.Event()

    def watch() -> None:
        # Connections the worker has open (named after its holder), and its runs in flight.
        while not done.is_set():
            (row,) = stack.rows(
                "SELECT (SELECT count(*) FROM pg_stat_activity WHERE application_name = :a) "
                "AS conns, (SELECT count(*) FROM runs WHERE status = 'running') AS running",
                a=name,
            )
            peak[0], in_flight[0] = max(peak[0], row.conns), max(in_flight[0], row.running)
            time.sleep(0.02)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        runs = [stack.start(script, user_input=f"read {i}") for i in range(HELD)]
        wait_all(stack, runs, timeout=90)
    finally:
        done.set()
        watcher.join()
    assert in_flight[0] >= 3 * pool_max, f"only {in_flight[0]} runs were in flight at once"
    judge_runs(stack, runs).assert_clean()
    assert 0 < peak[0] <= pool_max, f"the worker had {peak[0]} connections (bound {pool_max})"


def _start_refused(stack, concurrency: int, env: dict[str, str]) -> str:
    argv = worker_argv("refused", stack.settings.queue, concurrency, pool="threads")
    done = subprocess.run(
        argv, env={**stack.env, **env}, capture_output=True, text=True, timeout=90, check=False
    )
    assert done.returncode == 2, (
        f"the worker started (exit {done.returncode}): {done.stderr[-800:]}"
    )
    (line,) = [x for x in done.stderr.splitlines() if "does not start" in x]
    return line


def test_a_thread_pool_postgres_cannot_serve_is_refused_at_start_with_the_numbers(stack) -> None:
    limits = db.connection_limits(stack.settings.database_url)
    too_many = limits.for_clients + 1  # an explicit bound the server cannot take
    line = _start_refused(stack, THREADS, {"LIYAGENT_DB_POOL_MAX": str(too_many)})
    assert (
        f"-P threads -c {THREADS} with LIYAGENT_DB_POOL_MAX={too_many} can open {too_many} "
        "Postgres connections"
    ) in line
    assert f"max_connections={limits.max_connections}" in line
    assert f"set LIYAGENT_DB_POOL_MAX to at most {limits.for_clients}" in line
    assert "raise max_connections" in line


def test_a_500_thread_worker_runs_its_runs_on_a_stock_postgres(stack) -> None:
    # The thread-pool line of docs/workers.md at -c 500, LIYAGENT_DB_POOL_MAX unset, against a
    # server of max_connections 100 (a stock one): it starts, its threads take turns on the
    # default bound (32), and its runs end, judged from Postgres and the simulator's records
    # (issue 31).
    pg = PrivatePostgres(settings={"max_connections": "100"}).init().start()
    try:
        create_database(pg.url, "liyagent_stock")
        url = database_url(pg.url, "liyagent_stock")
        migrate.upgrade(url)
        stack.reconfigure(database_url=url)
        assert db.connection_limits(url).max_connections == 100
        worker = stack.worker("w1", pool="threads", concurrency=500)
        assert '"db_pool_max": 32' in worker.output(), worker.output()[-2000:]
        name = connection_name(holder_of(worker.popen.pid))
        runs = [stack.start(mixed(f"c{i}", latency_ms=300)) for i in range(60)]
        wait_all(stack, runs, timeout=120)
        judge_runs(stack, runs).assert_clean()
        (row,) = stack.rows(
            "SELECT count(*) AS n FROM pg_stat_activity WHERE application_name = :a", a=name
        )
        assert row.n <= pools.THREADS_DB_POOL_DEFAULT, row.n
    finally:
        stack.close()
        pg.remove()


def test_a_redis_pool_under_the_threads_is_refused_at_start(stack) -> None:
    line = _start_refused(stack, THREADS, {"LIYAGENT_REDIS_POOL_MAX": "10"})
    assert f"LIYAGENT_REDIS_POOL_MAX=10 is under what -P threads -c {THREADS} needs: 44" in line
