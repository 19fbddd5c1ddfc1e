"""Redis behind Sentinel: every Redis use (the broker, leases, heartbeat, presence, the death
watch, the sweep lock, reservations) follows the master its Sentinels name, from the one
setting; and a failover (the primary SIGKILLed, its replica promoted) loses no run and repeats
no write, judged from Postgres and the simulators' records."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
import redis

from liyagent.local.procs import ROOT
from liyagent.local.servers import free_port
from runtime.fleet.presence import connection_name, epoch_key
from runtime.services import holder_of
from tests.support.judge import judge_runs, wait_all
from tests.support.scripts import mixed
from tests.support.sentinels import MASTER, SentinelGroup

LATENCY_MS = 500
RUNS = 6


@pytest.fixture
def sentinels(stack, tmp_path: Path) -> Iterator[SentinelGroup]:
    group = SentinelGroup(tmp_path / "sentinels")
    try:
        yield group.start()
    finally:
        stack.close()  # the workers first, so none sees its Redis go at the end
        group.stop()


def _on_sentinels(stack, group: SentinelGroup) -> None:
    """Every process started from now on (and this one's services) knows only the Sentinels."""
    stack.reconfigure(redis_url=group.url, redis_master=MASTER)


def test_a_worker_given_only_the_sentinels_runs_through_them(stack, sentinels) -> None:
    _on_sentinels(stack, sentinels)
    worker = stack.worker("w1")
    stack.beat()
    run_id = stack.start(mixed("s", latency_ms=50))
    assert stack.wait(run_id, timeout=60).status == "succeeded"
    judge_runs(stack, [run_id]).assert_clean()
    primary = redis.Redis(port=sentinels.primary.port, socket_timeout=5)
    try:
        ns = stack.settings.namespace
        # The broker: the run queue's binding lives on the master the Sentinels name.
        assert primary.exists(f"{ns}_kombu.binding.{stack.settings.queue}")
        # The engine: the worker's presence (its epoch, its named connections) is there too.
        holder = holder_of(worker.popen.pid)
        assert primary.get(epoch_key(ns, holder)) is not None
        names = [c["name"] for c in primary.client_list()]
        assert names.count(connection_name(holder)) >= 2, names  # presence and the client
        # The worker's own sweeps take the sweep lock there.
        deadline = time.monotonic() + 30
        while not primary.exists(f"{ns}metrics:sweep_count"):
            assert time.monotonic() < deadline, "no sweep ran on the master"
            time.sleep(0.1)
    finally:
        primary.close()


def test_a_killed_worker_is_seen_by_the_death_watch_through_the_sentinels(stack, sentinels):
    """The death watch reads the master's CLIENT LIST, found through the Sentinels: a worker
    SIGKILLed (its whole group) is seen by its closed, named connections, not its lease."""
    _on_sentinels(stack, sentinels)
    victim = stack.worker("victim")
    run_id = stack.start(mixed("k", latency_ms=800))
    deadline = time.monotonic() + 30
    while stack.client.get(run_id).status != "running":
        assert time.monotonic() < deadline, "the run never got going"
        time.sleep(0.05)
    victim.kill()
    stack.worker("survivor", sweeps=False)  # its main process runs the death watch
    assert stack.wait(run_id, timeout=60).status == "succeeded"
    judge_runs(stack, [run_id]).assert_clean()
    seen = stack.rows(
        "SELECT detail->>'seen' AS seen FROM audit_events WHERE run_id = :r "
        "AND kind = 'agent.run.lost'",
        r=run_id,
    )
    assert [r.seen for r in seen] == ["connection_closed"]


def _until_in_flight(stack, run_ids: list[str], at_least: int, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while sum(stack.client.get(r).step >= 1 for r in run_ids) < at_least:
        assert time.monotonic() < deadline, "the runs never got going"
        time.sleep(0.05)


def _batch(stack, tag: str) -> list[str]:
    return [stack.start(mixed(f"{tag}{i}", latency_ms=LATENCY_MS)) for i in range(RUNS)]


def _finished(stack, runs: list[str]) -> list:
    return stack.rows(
        "SELECT id, status, lost_count, attempt, started_at, finished_at FROM runs "
        "WHERE id = ANY(CAST(:ids AS uuid[]))",
        ids=runs,
    )


@pytest.mark.kill
def test_redis_fails_over_through_sentinel_mid_run(stack, sentinels, publish_figures) -> None:
    _on_sentinels(stack, sentinels)
    stack.worker("w1")
    stack.worker("w2")
    stack.beat()
    # The normal time of a batch, measured here: start to the last run's end, no fault.
    started = datetime.now(tz=UTC)
    calm = _batch(stack, "calm")
    wait_all(stack, calm)
    normal_s = (max(r.finished_at for r in _finished(stack, calm)) - started).total_seconds()

    runs = _batch(stack, "f")
    _until_in_flight(stack, runs, at_least=2)
    killed_at = datetime.now(tz=UTC)
    sentinels.primary.stop()  # SIGKILL: no goodbye to any client
    wait_all(stack, runs, timeout=90)

    assert sentinels.master_port() == sentinels.replica.port  # the replica was promoted
    verdict = judge_runs(stack, runs)
    verdict.assert_clean()  # all succeeded, 0 duplicate and 0 stale writes (vendors' records)
    assert sum(verdict.duplicate_writes.values()) == 0
    rows = _finished(stack, runs)
    assert len(rows) == RUNS and all(r.status == "succeeded" for r in rows), rows
    took = (max(r.finished_at for r in rows) - killed_at).total_seconds()
    losses = sum(r.lost_count for r in rows)
    publish_figures.append(
        f"redis failover (sentinel): {RUNS} runs, last ended {took:.1f} s after the kill "
        f"(normal batch {normal_s:.1f} s), losses charged {losses}"
    )
    # No process died: a lease that lapsed while there was no master is taken back by its
    # live holder (or resumed as a store fault), never charged as a loss.
    assert losses == 0, [(r.id, r.lost_count) for r in rows if r.lost_count]
    bound = normal_s + 10
    assert took <= bound, f"the last run ended {took:.1f} s after the kill (bound {bound:.1f} s)"


def _start(argv: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", *argv], env=env, cwd=ROOT, capture_output=True, text=True, timeout=60
    )


WORKER = ["celery", "-A", "tasks", "worker", "-c", "1"]


@pytest.mark.parametrize(
    ("master", "says"),
    [
        ("", "LIYAGENT_REDIS_URL names Sentinels but LIYAGENT_REDIS_MASTER is not set"),
        ("mymaster", "LIYAGENT_REDIS_URL: no Sentinel answers at 127.0.0.1:"),
    ],
    ids=["no-master-name", "no-sentinel-answers"],
)
def test_bad_sentinel_settings_refuse_to_start(stack, master, says) -> None:
    nowhere = f"sentinel://127.0.0.1:{free_port()};sentinel://127.0.0.1:{free_port()}"
    env = {**stack.env, "LIYAGENT_REDIS_URL": nowhere, "LIYAGENT_REDIS_MASTER": master}
    # A missing name stops every process as it reads its settings; unreachable Sentinels are
    # found by the start-up check of the worker and of beat.
    for argv in (WORKER, *([["celery", "-A", "tasks", "beat"]] if master else [])):
        done = _start(argv, env)
        assert done.returncode == 2 and says in done.stderr, done.stderr[-2000:]
        assert "Traceback" not in done.stderr


def test_a_master_name_the_sentinels_do_not_know_refuses_to_start(stack, sentinels) -> None:
    env = {**stack.env, "LIYAGENT_REDIS_URL": sentinels.url, "LIYAGENT_REDIS_MASTER": "other"}
    done = _start(WORKER, env)
    assert done.returncode == 2, done.stderr[-2000:]
    assert "LIYAGENT_REDIS_MASTER='other': the Sentinels at" in done.stderr
    assert "Traceback" not in done.stderr
