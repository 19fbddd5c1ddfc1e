"""Every process behind PgBouncer in transaction pooling (LIYAGENT_DATABASE_POOLER=pgbouncer):
statements of many clients sharing a few server sessions, runs with tools to their end, a
worker killed mid-run and one stalled past its lease, both taken over, and the kill trials in
their short form; what a pooled link cannot give (the session bounds a direct link sets at
connect, a migration's own session) refused at start, naming the setting.

The private PgBouncer (tests/support/pgbouncer.py) holds fewer server sessions than the
deployment opens client connections, and takes no startup options, as a stock one."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa

from liyagent.local.procs import ROOT
from liyagent.local.trials import TrialOptions, run_trials
from liyagent.local.verdict import summary_line
from runtime.ops import startup
from store import db
from store.db import Pooler
from store.states import Seen
from tests.support.judge import judge_runs, until_in_flight, wait_all
from tests.support.pgbouncer import PrivatePgBouncer, bound_sessions, renew_sessions
from tests.support.scripts import mixed
from tests.support.stack import Stack
from tests.support.trial_setup import assert_no_trial_failed, trial_deployment

# The trials' short form here: two rounds, each victim killed while its runs are under way (a
# trial's agent takes 800 ms a step, its longest run four steps; the kill comes 0.4-1.5 s after
# the victim is up, while every run it took is on its first or second step).
TRIALS = 6
STEP_LATENCY_MS = 800
KILL_WINDOW_S = (0.4, 1.5)
# The spec's table: a trial caught in flight ends within 15 s of its kill.
RECOVERY_BOUND_S = 15.0


@pytest.fixture(scope="module")
def pgbouncer(servers: tuple[str, str]) -> Iterator[PrivatePgBouncer]:
    server = sa.make_url(servers[0])
    bouncer = PrivatePgBouncer(
        server.host or "127.0.0.1", server.port or 5432, user=server.username or "postgres"
    ).start()
    yield bouncer
    bouncer.stop()


def _database(db_url: str) -> str:
    return str(sa.make_url(db_url).database)


@pytest.fixture
def pooled_stack(
    request: pytest.FixtureRequest,
    stack: Stack,
    pgbouncer: PrivatePgBouncer,
    db_url: str,
    servers: tuple[str, str],
) -> Stack:
    """The suite's stack with every process's database (and the test's own) through the
    pooler; its database's sessions bounded as a pooled deployment's role is, unless the test
    asks for none (`indirect` parameter False)."""
    if getattr(request, "param", True):
        bound_sessions(servers[0], _database(db_url))
    stack.reconfigure(
        database_url=pgbouncer.url(_database(db_url)), database_pooler=Pooler.PGBOUNCER
    )
    return stack


def test_statements_many_clients_repeat_never_meet_a_prepared_statement(
    pgbouncer: PrivatePgBouncer, servers: tuple[str, str], db_url: str
) -> None:
    """Three processes' engines, twelve threads, each statement repeated past psycopg's
    threshold for preparing it, over eight server sessions: each lands on whichever session is
    free, and none finds a statement another client prepared, or misses its own."""
    bound_sessions(servers[0], _database(db_url))
    url = pgbouncer.url(_database(db_url))
    engines = [db.create(url, pool_max=4, pooler=Pooler.PGBOUNCER) for _ in range(3)]
    errors: list[str] = []

    def work(engine: sa.Engine) -> None:
        try:
            for n in range(40):
                with engine.connect() as conn:
                    got = conn.execute(db.sql("SELECT CAST(:n AS int) + 1"), {"n": n}).scalar()
                    assert got == n + 1
        except Exception as exc:  # every failure is reported, not only the first thread's
            errors.append(f"{type(exc).__name__}: {str(exc).splitlines()[0]}")

    threads = [threading.Thread(target=work, args=(engines[i % 3],)) for i in range(12)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
        assert errors == [], errors[:3]
        # The bounds a direct link sets at connect, here from the server for every session.
        _, found = db.session_bounds(engines[0])
        assert found == db.SESSION_BOUNDS_MS
    finally:
        for engine in engines:
            engine.dispose()


def test_runs_with_tools_succeed_on_a_threads_worker_behind_pgbouncer(pooled_stack) -> None:
    stack = pooled_stack
    stack.worker("w1", pool="threads", concurrency=6)
    stack.beat()
    runs = [stack.start(mixed(f"p{i}")) for i in range(6)]
    wait_all(stack, runs, timeout=60)
    verdict = judge_runs(stack, runs)
    verdict.assert_clean()
    assert verdict.losses == 0
    for run_id in runs:
        assert stack.posts_by_vendor(run_id) == {"incidents": 1, "issues": 1, "chat": 1}


@pytest.mark.kill
def test_a_worker_killed_mid_run_is_resumed_by_another_behind_pgbouncer(pooled_stack) -> None:
    stack = pooled_stack
    runs: list[str] = []

    def start() -> str:
        runs.extend(stack.start(mixed(f"k{i}", latency_ms=200)) for i in range(3))
        until_in_flight(stack, runs)
        return runs[0]

    stack.kill_then_resume("after_checkpoint:kill:2", start)
    wait_all(stack, runs, timeout=60)
    verdict = judge_runs(stack, runs)
    verdict.assert_clean()
    assert verdict.losses >= 1  # the killed worker's runs were claimed and resumed


@pytest.mark.kill
def test_a_stalled_worker_is_swept_and_fenced_behind_pgbouncer(pooled_stack) -> None:
    """Stopped past its lease, the worker's run is claimed by a sweep (no death: its
    connections stay open); woken, its next fenced write matches nothing."""
    stack = pooled_stack
    victim = stack.worker("victim", fault="after_checkpoint:stop")
    run_id = stack.start(mixed("s"))
    stopped_pid = int(stack.fault_hit("victim").split()[1])
    stack.worker("survivor")
    view = stack.wait(run_id, timeout=60)
    assert view.status == "succeeded" and view.attempt == 2 and view.lost_count == 1
    seen = stack.rows(
        "SELECT detail->>'seen' AS seen FROM audit_events WHERE run_id = :r "
        "AND kind = 'agent.run.lost'",
        r=run_id,
    )
    assert [row.seen for row in seen] == [Seen.LEASE_LAPSED]  # by a sweep
    os.kill(stopped_pid, signal.SIGCONT)
    victim.wait_for(r"run\.fenced_out", timeout=30)
    judge_runs(stack, [run_id]).assert_clean()


@pytest.mark.kill
@pytest.mark.timeout(240)
def test_kill_trials_behind_pgbouncer(
    pgbouncer, servers, db_url, namespace, seal_keys, tmp_path: Path, publish_figures: list[str]
) -> None:
    """The kill trials' short form, every process of the deployment (victims, survivor, beat,
    front, the judge) through the pooler, on the product's own timings."""
    bound_sessions(servers[0], _database(db_url))
    options = TrialOptions(
        trials=TRIALS, kill_window_s=KILL_WINDOW_S, step_latency_ms=STEP_LATENCY_MS
    )
    pooled = pgbouncer.url(_database(db_url))
    with trial_deployment(
        servers, db_url, namespace, seal_keys, tmp_path, "bouncer", pooled=pooled
    ) as deployment:
        deployment.start(options)
        verdict = run_trials(deployment, options)
    publish_figures.append(f"kill trials behind pgbouncer: {summary_line(verdict)}")
    assert_no_trial_failed(verdict)
    slow = verdict.slow(RECOVERY_BOUND_S)
    assert slow == [], f"recovered later than {RECOVERY_BOUND_S:g} s after the kill: {slow}"


def _run(argv: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", *argv], env=env, cwd=ROOT, capture_output=True, text=True, timeout=60
    )


@pytest.mark.parametrize("pooled_stack", [False], indirect=True)
def test_what_a_pooled_link_cannot_give_is_refused_at_start(pooled_stack, servers) -> None:
    """Without the role's bounds a pooled worker refuses to start, naming the setting and the
    statements that give them; without the setting, PgBouncer's refusal of the session options
    is said with the setting to set; a migration through the pooler is refused, asking for the
    server's own address."""
    stack = pooled_stack
    url, database = stack.settings.database_url, _database(stack.settings.database_url)
    role = sa.make_url(url).username
    with pytest.raises(startup.StartupRefused) as refused:
        startup.check_database(url, Pooler.PGBOUNCER)
    said = str(refused.value)
    assert said.startswith("LIYAGENT_DATABASE_POOLER=pgbouncer: ")
    for name, ms in db.SESSION_BOUNDS_MS.items():
        assert f"{name}=none" in said
        assert f"ALTER ROLE {role} IN DATABASE {database} SET {name} = {ms}" in said

    worker = _run(["celery", "-A", "tasks", "worker", "-c", "1"], stack.env)
    assert worker.returncode == 2
    assert f"liyagent worker does not start: {said}" in worker.stderr
    assert "Traceback" not in worker.stderr

    direct = {**stack.env, "LIYAGENT_DATABASE_POOLER": "none"}
    status = _run(["liyagent", "status"], direct)
    assert status.returncode == 3
    assert "unsupported startup parameter" in status.stderr
    assert "set LIYAGENT_DATABASE_POOLER=pgbouncer" in status.stderr

    upgrade = _run(["liyagent", "db", "upgrade"], stack.env)
    assert upgrade.returncode == 2
    assert "a migration needs a session of its own" in upgrade.stderr
    assert "--url" in upgrade.stderr

    bound_sessions(servers[0], database)
    renew_sessions(servers[0], database)
    startup.check_database(url, Pooler.PGBOUNCER)  # bounded: it starts
