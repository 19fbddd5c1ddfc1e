"""Death seen directly: a process that dies is noticed by its closed connections (or by the
parent of a pool child), its runs claimed once and resumed, without waiting for its lease or a
sweep; a connection that only blips is left alone. Their survivors run no sweeps
(`sweeps=False`), so what recovers the runs is the death watch (in the surviving worker's main
process) or the parent. Judged from Postgres and the vendors' records."""

from __future__ import annotations

import os
import signal
import time
from datetime import UTC, datetime

import pytest

from liyagent.local.cluster import POOLS
from liyagent.local.judge import losses
from runtime.fleet.leases import Token
from runtime.flow.order import bucket_keys
from runtime.recovery.deaths import (
    CLAIM_BATCH,
    claim_and_publish,
    death_watch_leader,
    hand_lead,
)
from runtime.recovery.deps import RecoveryDeps
from runtime.services import holder_of
from store.runs import claim_delivery
from tests.support.judge import judge_runs, wait_all
from tests.support.proxy import CuttableProxy
from tests.support.scripts import mixed
from tests.support.stack import RecordingPublisher, services_with

pytestmark = pytest.mark.kill


def _losses(stack, run_id: str) -> list[str]:
    """How each loss of the run was seen, from the claims' own audit."""
    rows = stack.rows(
        "SELECT detail->>'seen' AS seen FROM audit_events WHERE run_id = :r "
        "AND kind IN ('agent.run.lost', 'agent.run.failed') AND detail ? 'lost_attempt' "
        "ORDER BY id",
        r=run_id,
    )
    return [r.seen for r in rows]


def _until(check, what: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def _holder_pid(stack, run_id: str) -> int:
    """The pid of the process holding the run's lease (its token names it)."""
    token = stack.services.leases.holder(run_id)
    assert token is not None
    return int(token.rsplit("-", 1)[1])


def test_a_pool_child_killed_under_a_living_parent_is_claimed_by_the_parent(stack) -> None:
    # The death watch would see the child's closed connections too (often first: Celery's
    # pool notices a dead child within seconds); it is slowed down here to show the parent's
    # own path, which needs no grace at all.
    worker = stack.worker(
        "w1", env={"LIYAGENT_DEATH_POLL_MS": "60000"}, pool="prefork", sweeps=False
    )
    run_id = stack.start(mixed("p", latency_ms=800))
    _until(lambda: stack.client.get(run_id).step >= 1, "the run never got going")
    child = _holder_pid(stack, run_id)
    assert child in worker.children()
    os.kill(child, signal.SIGKILL)  # the pool child only: the main process lives on
    view = stack.wait(run_id)
    assert view.status == "succeeded" and view.lost_count == 1
    assert _losses(stack, run_id) == ["pool_child_died"]
    judge_runs(stack, [run_id]).assert_clean()


def test_a_pool_child_whose_lease_lapsed_before_its_death_was_seen_is_still_claimed(
    stack,
) -> None:
    # On a loaded machine the parent can see a child's death after the child's lease has
    # lapsed: the run is still the parent's to claim (the claim is fenced by the attempt).
    worker = stack.worker(
        "w1", env={"LIYAGENT_DEATH_POLL_MS": "60000"}, pool="prefork", sweeps=False
    )
    run_id = stack.start(mixed("q", latency_ms=800))
    _until(lambda: stack.client.get(run_id).step >= 1, "the run never got going")
    child = _holder_pid(stack, run_id)
    assert child in worker.children()
    os.kill(child, signal.SIGSTOP)  # stalled: no renewal reaches Redis any more
    _until(lambda: stack.services.leases.holder(run_id) is None, "the lease never lapsed")
    os.kill(child, signal.SIGKILL)
    view = stack.wait(run_id)
    assert view.status == "succeeded" and view.lost_count == 1
    assert _losses(stack, run_id) == ["pool_child_died"]
    judge_runs(stack, [run_id]).assert_clean()


@pytest.mark.parametrize("pool", POOLS)
def test_a_killed_worker_is_seen_by_its_closed_connections(stack, pool: str) -> None:
    victim = stack.worker("victim", pool=pool)
    runs = [stack.start(mixed(f"d{i}", latency_ms=800)) for i in range(2)]
    _until(lambda: all(stack.client.get(r).status == "running" for r in runs), "not running")
    victim.kill()  # the whole process group, as a lost machine
    stack.worker("survivor", pool=pool, sweeps=False)  # its main process runs the death watch
    wait_all(stack, runs)
    for run_id in runs:
        assert stack.client.get(run_id).lost_count == 1
        assert _losses(stack, run_id) == ["connection_closed"]
    judge_runs(stack, runs).assert_clean()


@pytest.mark.parametrize(
    ("point", "found_by"),
    [
        # Reserved, not leased: the death watch publishes its reservation again.
        ("before_lease", "deaths.taken"),
        # Leased, not claimed: the acquire let the reservation go; the death watch publishes
        # again the run of the lease it takes back, still queued at that attempt.
        ("after_lease", "deaths.taken"),
        # Taken off the queue, not yet reserved: only the broker's unacknowledged copy knows;
        # the sweep publishes it again once the death grace has passed.
        ("before_reserve", "sweep.done"),
    ],
)
def test_a_run_whose_worker_died_before_claiming_it_is_published_again(
    stack, point: str, found_by: str
) -> None:
    victim = stack.worker("victim", fault=f"{point}:kill")
    run_id = stack.start(mixed(point))
    stack.fault_hit("victim")
    victim.popen.wait(timeout=10)
    assert stack.client.get(run_id).status == "queued"  # never claimed: nothing was lost
    # The outbox (republishing runs queued too long) is out of the way: each path is its own.
    # Each path alone: the death watch's with no sweeps; the sweep's (no death seen) with them.
    survivor = stack.worker(
        "survivor",
        env={"LIYAGENT_REQUEUE_AFTER_MS": "600000"},
        sweeps=found_by == "sweep.done",
    )
    view = stack.wait(run_id, timeout=60)
    assert view.status == "succeeded" and view.lost_count == 0 and view.attempt == 1
    survivor.wait_for(rf'"republished": \[[^\]]*"{run_id}"[^\n]*"{found_by}"', timeout=10)
    judge_runs(stack, [run_id]).assert_clean()


def test_a_blip_shorter_than_the_grace_claims_nothing(stack) -> None:
    host, port = stack.redis_address()
    proxy = CuttableProxy(host, port)
    stack.worker(
        "watcher", runs=False, sweeps=False
    )  # a death watch that does not go through the proxy
    stack.worker(
        "blipped", env={"LIYAGENT_REDIS_URL": f"redis://127.0.0.1:{proxy.port}/0"}, sweeps=False
    )
    runs = [stack.start(mixed(f"b{i}", latency_ms=1000)) for i in range(2)]
    _until(lambda: all(stack.client.get(r).step >= 1 for r in runs), "not in flight")
    proxy.blip()
    wait_all(stack, runs)
    for run_id in runs:
        view = stack.client.get(run_id)
        assert view.status == "succeeded" and view.lost_count == 0, view
    judge_runs(stack, runs).assert_clean()


def test_twenty_runs_on_workers_that_all_die_at_once(stack) -> None:
    victims = [stack.worker(f"victim{i}", concurrency=5, sweeps=False) for i in range(4)]
    # Each run long enough (4 steps of 3 s) that all twenty are in flight together even when
    # the last one's worker takes its message several seconds after the first (a loaded host).
    runs = [stack.start(mixed(f"m{i}", latency_ms=3000)) for i in range(20)]
    _until(
        lambda: all(stack.client.get(r).status == "running" for r in runs),
        "the twenty runs never all ran",
        timeout=60,
    )
    for victim in victims:
        victim.kill()
    stack.worker("survivor", concurrency=6, sweeps=False)
    wait_all(stack, runs, timeout=180)
    for run_id in runs:
        view = stack.client.get(run_id)
        assert view.status == "succeeded" and view.lost_count == 1, view
        assert _losses(stack, run_id) == ["connection_closed"]
    judge_runs(stack, runs).assert_clean()


# Killed while leading the death watch, the survivor's watch claims the victim's run within
# this many seconds of the kill. The leader key's TTL (2 s) alone put the old takeover at
# 2.8-3.3 s (the TTL left, then the 1 s grace); seen at once, it is the grace and a poll or
# two (about 1.3 s), with the rest as margin for a loaded machine.
LEADER_DEATH_CLAIM_S = 2.2


def test_a_killed_death_watch_leader_is_claimed_by_the_survivors_watch_within_the_grace(
    stack,
) -> None:
    leader = stack.worker("leader", pool="prefork")  # its run is held by a pool child
    holder = holder_of(leader.popen.pid)
    _until(
        lambda: (
            death_watch_leader(stack.services.redis, stack.services.settings.namespace) == holder
        ),
        "the first worker never led",
    )
    run_id = stack.start(mixed("lead", latency_ms=2500))
    _until(lambda: stack.client.get(run_id).status == "running", "the run never got going")
    assert _holder_pid(stack, run_id) in leader.children()
    survivor = stack.worker("survivor", sweeps=False)  # its watch follows the leader's
    assert stack.client.get(run_id).status == "running", "the run ended before the kill"
    assert death_watch_leader(stack.services.redis, stack.services.settings.namespace) == holder
    killed_at = datetime.now(tz=UTC)
    leader.kill()
    survivor.wait_for(rf'"claimed": \[[^\]]*"{run_id}"[^\n]*"deaths.taken"', timeout=20)
    with stack.engine.connect() as conn:
        (loss,) = losses(conn, [run_id])[run_id]
    taken_s = (loss.taken_over_at - killed_at).total_seconds()
    assert _losses(stack, run_id) == ["connection_closed"]
    assert taken_s < LEADER_DEATH_CLAIM_S, f"claimed {taken_s:.2f} s after the leader's kill"
    view = stack.wait(run_id)
    assert view.status == "succeeded" and view.lost_count == 1
    judge_runs(stack, [run_id]).assert_clean()


def test_a_death_holding_hundreds_of_runs_is_claimed_in_bounded_batches_each_published_once(
    stack,
) -> None:
    # What the death watch does with a dead holder's 250 tokens: claims of at most
    # CLAIM_BATCH runs a statement, each batch's messages published in one call as soon as it
    # commits; every run claimed once (I4), so a second pass over the same tokens claims none.
    held = 2 * CLAIM_BATCH + 50
    runs = [stack.start(mixed(f"b{i}")) for i in range(held)]  # no worker: they stay queued
    with stack.db() as conn:
        for run_id in runs:
            assert claim_delivery(conn, run_id, 1, "dead-holder") is not None
    publisher = RecordingPublisher()
    s = services_with(stack, publisher)
    tokens = [Token(run_id, 1, "dead-holder") for run_id in runs]
    claimed = claim_and_publish(RecoveryDeps.of(s), tokens, "connection_closed")
    assert sorted(claimed) == sorted(runs)
    assert [len(b) for b in publisher.batches] == [CLAIM_BATCH, CLAIM_BATCH, 50]
    assert sorted(publisher.sent) == sorted((run_id, 2) for run_id in runs)
    assert claim_and_publish(RecoveryDeps.of(s), tokens, "connection_closed") == []
    assert len(publisher.sent) == held
    lost = stack.rows(
        "SELECT count(*) AS n FROM runs WHERE id = ANY(CAST(:ids AS uuid[])) "
        "AND status = 'queued' AND attempt = 2 AND lost_count = 1",
        ids=runs,
    )[0].n
    assert lost == held


@pytest.mark.parametrize("seen", ["gone", "taken", "idle"])
def test_a_message_a_dying_worker_took_and_recorded_nowhere_is_published_again(
    stack, seen: str
) -> None:
    # kombu takes a message off the queue (BRPOP), then records its delivery in a second
    # round trip: a worker killed in between leaves the message nowhere in Redis. Taken off
    # the queue here by hand, as that worker's BRPOP takes it. The outbox is out of the way:
    # the death watch publishes it again when it sees a worker with work gone ("gone": the
    # survivor leads and watched the victim live), when it takes a dead one's work ("taken":
    # the survivor starts after the kill), or a dead worker that held nothing else ("idle":
    # every worker's main process is watched from its start).
    quiet = {"LIYAGENT_REQUEUE_AFTER_MS": "600000"}
    # This Redis held the runs' messages from the start: no worker's first look publishes
    # again the runs queued before it (as it does after Redis lost its data).
    leases = stack.services.leases
    leases.mark_epoch(leases.store_epoch(), "requeued")
    lost = stack.start(mixed("untraced"))
    client = stack.services.redis
    ns = stack.settings.namespace
    taken = [client.rpop(key) for key in bucket_keys(f"{ns}{stack.settings.queue}")]
    assert sum(m is not None for m in taken) == 1, "not the only message queued"
    victim = stack.worker("victim", env=quiet, sweeps=False)
    victim_holder = holder_of(victim.popen.pid)
    _until(lambda: victim_holder in leases.holders_with_work(), "never watched")
    runs = [lost]
    if seen != "idle":
        held = stack.start(mixed("held", latency_ms=2000))
        _until(lambda: stack.client.get(held).status == "running", "the victim never ran it")
        runs.append(held)
    survivor = None
    if seen == "gone":
        survivor = stack.worker("survivor", env=quiet, sweeps=False)
        holder = holder_of(survivor.popen.pid)
        _until(lambda: hand_lead(client, ns, holder), "the survivor never named its connections")
        _until(lambda: death_watch_leader(client, ns) == holder, "the survivor never led")
        # Four looks: the survivor has seen the victim consuming (were it slower, the look
        # that takes the victim's work would publish the message again: the "taken" case).
        time.sleep(1.0)
    victim.kill()
    if survivor is None:
        survivor = stack.worker("survivor", env=quiet, sweeps=False)
    survivor.wait_for(rf'"{lost}"[^\n]*"deaths.untraced_published"', timeout=20)
    view = stack.wait(lost, timeout=60)
    assert view.status == "succeeded" and view.attempt == 1 and view.lost_count == 0
    wait_all(stack, runs)
    judge_runs(stack, runs).assert_clean()
    # The victim's death is taken (after its grace): it is watched no more.
    _until(lambda: victim_holder not in leases.holders_with_work(), "its death never taken")


def test_a_worker_that_ends_cleanly_is_watched_no_more(stack) -> None:
    worker = stack.worker("leaving", sweeps=False)
    holder = holder_of(worker.popen.pid)
    _until(lambda: holder in stack.services.leases.holders_with_work(), "never watched")
    worker.popen.send_signal(signal.SIGTERM)
    worker.popen.wait(timeout=30)
    assert holder not in stack.services.leases.holders_with_work()
