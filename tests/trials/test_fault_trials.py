"""Fault trials: the faults a Celery + Redis + Postgres deployment really meets, each judged
like the kill trials, from Postgres and the vendor's records only."""

from __future__ import annotations

import time
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from liyagent.local.cluster import POOLS
from liyagent.local.servers import PrivatePostgres, PrivateRedis
from runtime.base.sealing import new_key_entry, parse_keys
from runtime.base.settings import Timings
from store import migrate
from store.admin import create_database, database_url
from tests.support.judge import judge_runs, run_rows, until_in_flight, wait_all
from tests.support.proxy import CuttableProxy
from tests.support.scripts import mixed

pytestmark = pytest.mark.kill


def _start_runs(stack, n: int, latency_ms: int = 500) -> list[str]:
    return [stack.start(mixed(f"f{i}", latency_ms=latency_ms)) for i in range(n)]


def _restart_bound_s(t: Timings, latency_ms: int) -> float:
    """The longest a run may take to end after Postgres restarts under it: a run in flight is
    given back by its own worker as soon as Postgres answers, and a queued one whose message
    was held is tried again within the outage's longest pause (2 s); then the sweep and the
    whole run again; doubled, for a loaded 2-core machine."""
    seen_ms = 2000 + t.sweep_interval_ms
    run_ms = len(mixed("x")) * latency_ms
    return 2 * (seen_ms + run_ms) / 1000


def _assert_restart_survived(stack, runs: list[str], fault_at: datetime, latency_ms: int) -> None:
    """A Postgres restart, judged from Postgres and the simulator's records: every run ends
    succeeded, with no vendor effect twice and nothing written after a give-back; no run is
    charged a loss or claimed (every worker process lived: a store fault is not a loss), each
    run's extra attempts are its workers' store-fault give-backs, audited as such; the last
    run ends within the bound."""
    verdict = judge_runs(stack, runs)
    verdict.assert_clean()
    assert sum(verdict.duplicate_writes.values()) == 0, verdict.duplicate_writes
    rows = run_rows(stack, runs)
    assert len(rows) == len(runs)
    for r in rows:
        assert r.status == "succeeded" and r.lost_count == 0 and r.claimed == 0, r
        assert r.attempt == 1 + r.store_faulted and r.crash_resumed == 0, r
    took = (max(r.finished_at for r in rows) - fault_at).total_seconds()
    bound = _restart_bound_s(stack.settings.timings, latency_ms)
    assert took <= bound, f"the last run ended {took:.1f} s after the fault (bound {bound:.1f} s)"


def _normal_run_s(stack, n: int, latency_ms: int) -> float:
    """How long `n` runs started together take on this stack with no fault: the longest."""
    runs = [stack.start(mixed(f"n{i}", latency_ms=latency_ms)) for i in range(n)]
    wait_all(stack, runs)
    rows = run_rows(stack, runs)
    return max((r.finished_at - r.created_at).total_seconds() for r in rows)


def test_redis_restarted_empty_mid_run(stack, tmp_path) -> None:
    """A store blip is not a death: Redis killed and restarted empty under runs in flight on
    two live workers costs them no loss and no resume; each holder takes its lease back and
    keeps its run, and every run ends within its normal time + 10 s."""
    redis = PrivateRedis(tmp_path / "redis").start()
    try:
        stack.reconfigure(redis_url=redis.url)
        stack.worker("w1")
        stack.worker("w2")
        stack.beat()
        normal_s = _normal_run_s(stack, 4, latency_ms=500)
        runs = _start_runs(stack, 4)
        until_in_flight(stack, runs)
        redis.stop()  # every lease, message and lock is gone
        redis.start()
        wait_all(stack, runs)
        verdict = judge_runs(stack, runs)
        verdict.assert_clean()
        assert sum(verdict.duplicate_writes.values()) == 0, verdict.duplicate_writes
        rows = run_rows(stack, runs)
        assert len(rows) == len(runs)
        for r in rows:
            assert r.status == "succeeded" and r.lost_count == 0, r
            assert r.claimed == 0 and r.crash_resumed == 0, r  # no loss charged or resumed
            assert r.attempt == 1 and r.store_faulted == 0, r  # each holder kept its run
            took = (r.finished_at - r.created_at).total_seconds()
            assert took <= normal_s + 10, f"run took {took:.1f} s (normal {normal_s:.1f} s)"
    finally:
        redis.stop()


def test_queued_runs_start_at_once_after_redis_restarted_empty(stack, tmp_path) -> None:
    """Runs queued when Redis comes back empty lost their messages with it: they are published
    again as soon as the new Redis is seen, not after the outbox's 30 s."""
    redis = PrivateRedis(tmp_path / "redis").start()
    try:
        slow_outbox = replace(stack.settings.timings, requeue_after_ms=30_000)
        stack.reconfigure(redis_url=redis.url, timings=slow_outbox)
        stack.worker("ops", runs=False)  # the death watch and the sweeps; no run slot
        stack.beat()
        runs = _start_runs(stack, 3)  # their messages wait in the broker
        redis.stop()  # and are gone with it
        redis.start()
        stack.worker("w1")
        ready_at = datetime.now(tz=UTC)
        wait_all(stack, runs)
        judge_runs(stack, runs).assert_clean()
        for r in run_rows(stack, runs):
            waited = (r.started_at - ready_at).total_seconds()
            assert waited <= 5, f"run {r.id} started {waited:.1f} s after a worker was ready"
            assert r.lost_count == 0, r
    finally:
        redis.stop()


def test_a_worker_killed_as_redis_restarts_empty_is_still_claimed(stack, tmp_path) -> None:
    """Of two workers with runs in flight when Redis restarts empty, the one SIGKILLed as it
    comes back never takes its leases back: its runs are claimed once, charged one loss each,
    and resumed; the live worker's runs keep going, charged nothing."""
    redis = PrivateRedis(tmp_path / "redis").start()
    try:
        stack.reconfigure(redis_url=redis.url)
        victim = stack.worker("victim")
        stack.worker("survivor")
        stack.beat()
        runs = _start_runs(stack, 4, latency_ms=800)
        deadline = time.monotonic() + 30
        while True:
            rows = run_rows(stack, runs)
            if all(r.status == "running" for r in rows):
                break
            assert time.monotonic() < deadline, "the runs never all got going"
            time.sleep(0.05)
        pids = {int(r.claimed_by.rsplit("-", 1)[1]) for r in rows}
        children = victim.children()
        on_victim = {r.id for r in rows if int(r.claimed_by.rsplit("-", 1)[1]) in children}
        assert on_victim and len(on_victim) < len(runs), (on_victim, pids)
        redis.stop()
        redis.start()
        victim.kill()  # the whole process group, as Redis comes back: it never returns
        wait_all(stack, runs)
        verdict = judge_runs(stack, runs)
        verdict.assert_clean()
        assert sum(verdict.duplicate_writes.values()) == 0, verdict.duplicate_writes
        for r in run_rows(stack, runs):
            assert r.status == "succeeded", r
            if r.id in on_victim:
                assert r.lost_count == 1 and r.claimed == 1 and r.crash_resumed == 1, r
            else:
                assert r.lost_count == 0 and r.claimed == 0 and r.crash_resumed == 0, r
    finally:
        redis.stop()


# Under threads too: every run's thread shares its process's pool, whose connections all drop.
@pytest.mark.parametrize("pool", POOLS)
def test_postgres_restarted_mid_run(stack, tmp_path, pool: str) -> None:
    pg = PrivatePostgres().init().start()
    try:
        create_database(pg.url, "liyagent_fault")
        url = database_url(pg.url, "liyagent_fault")
        migrate.upgrade(url)
        stack.reconfigure(database_url=url)
        stack.worker("w1", pool=pool)
        stack.worker("w2", pool=pool)
        stack.beat()
        runs = _start_runs(stack, 4)
        until_in_flight(stack, runs)
        fault_at = datetime.now(tz=UTC)
        pg.stop("fast")  # every connection of every process drops
        pg.start()
        wait_all(stack, runs)
        _assert_restart_survived(stack, runs, fault_at, latency_ms=500)
    finally:
        stack.close()
        pg.remove()


def test_every_message_delivered_twice(stack, monkeypatch) -> None:
    twice = {"LIYAGENT_FAULT_PUBLISH_TIMES": "2"}
    monkeypatch.setenv("LIYAGENT_FAULT_PUBLISH_TIMES", "2")
    stack.worker("victim", fault="after_mark:kill", env=twice)
    runs = _start_runs(stack, 3, latency_ms=200)
    stack.fault_hit("victim")
    stack.worker("survivor", env=twice)
    stack.beat()
    wait_all(stack, runs)
    verdict = judge_runs(stack, runs)
    verdict.assert_clean()
    for run_id in runs:
        lost = stack.client.get(run_id).lost_count
        assert all(n <= 1 + lost for n in stack.asked(run_id).values())
        audited = stack.rows(
            "SELECT count(*) AS n FROM audit_events WHERE run_id = :r AND kind = 'agent.run.lost'",
            r=run_id,
        )[0].n
        assert audited == lost  # each loss claimed once, however many messages


def test_two_beats_claim_each_loss_once(stack) -> None:
    stack.worker("victim", fault="after_checkpoint:kill", concurrency=3)
    runs = _start_runs(stack, 3, latency_ms=300)
    stack.fault_hit("victim")
    stack.worker("survivor")
    stack.beat("beat1")
    stack.beat("beat2")
    wait_all(stack, runs)
    verdict = judge_runs(stack, runs)
    verdict.assert_clean()
    assert verdict.losses >= 1
    for run_id in runs:
        lost = stack.client.get(run_id).lost_count
        audited = stack.rows(
            "SELECT count(*) AS n FROM audit_events WHERE run_id = :r AND kind = 'agent.run.lost'",
            r=run_id,
        )[0].n
        assert lost <= 1 and audited == lost


# Under threads too: one process's cut connections stop every run it holds.
@pytest.mark.parametrize("pool", POOLS)
def test_worker_cut_off_from_redis_stops_writing_within_a_lease(stack, servers, pool: str) -> None:
    host, port = servers[1].split("//")[1].split("/")[0].split(":")
    proxy = CuttableProxy(host, int(port))
    stack.worker("survivor", pool=pool)  # recovers on the stack's queue
    stack.beat()
    # The isolated worker alone consumes the queue the runs start on, so they start on it.
    stack.reconfigure(queue=f"{stack.settings.queue}.isolated")
    cut = {"LIYAGENT_REDIS_URL": f"redis://127.0.0.1:{proxy.port}/0"}
    stack.worker("isolated", env=cut, pool=pool)
    runs = _start_runs(stack, 2, latency_ms=1500)
    until_in_flight(stack, runs)
    cut_at = datetime.now(tz=UTC)
    proxy.cut()
    wait_all(stack, runs)
    judge_runs(stack, runs).assert_clean()
    lease = timedelta(milliseconds=stack.settings.timings.lease_ttl_ms)
    last = stack.rows(
        "SELECT max(at) AS last_at FROM (SELECT checkpointed_at AS at FROM runs "
        "WHERE checkpoint_attempt = 1 AND id = ANY(CAST(:ids AS uuid[])) "
        "UNION ALL SELECT marked_at FROM call_marks "
        "WHERE attempt = 1 AND run_id = ANY(CAST(:ids AS uuid[]))) w",
        ids=runs,
    )[0].last_at
    assert last is None or last <= cut_at + lease, "the cut-off worker kept writing"
    sent = stack.vendor(
        "SELECT max(created_at) AS last_at FROM sim.requests WHERE attempt = 1 AND "
        "method = 'POST' AND run_id = ANY(:ids)",
        ids=runs,
    )[0].last_at
    assert sent is None or sent <= cut_at + lease, "the cut-off worker kept calling vendors"
    assert any(stack.client.get(r).lost_count >= 1 for r in runs)


def test_seal_keys_rotated_while_runs_are_in_flight(stack) -> None:
    stack.worker("victim", fault="after_checkpoint:kill:2", concurrency=3)
    runs = _start_runs(stack, 3, latency_ms=200)
    stack.fault_hit("victim")
    rotated = f"{new_key_entry('k2')},{stack.seal_keys}"  # k2 seals now; the old key opens
    stack.seal_keys, stack.sealer = rotated, parse_keys(rotated)
    stack.reconfigure()
    stack.worker("survivor")
    stack.beat()
    wait_all(stack, runs)
    judge_runs(stack, runs).assert_clean()
    kids = {
        bytes(r.sealed)[4:6]
        for r in stack.rows(
            "SELECT sealed FROM run_steps WHERE run_id = ANY(CAST(:ids AS uuid[])) AND "
            "attempt > 1",  # the step records the resumed attempts wrote
            ids=runs,
        )
    }
    assert kids == {b"k2"}  # written after the rotation with the new key
