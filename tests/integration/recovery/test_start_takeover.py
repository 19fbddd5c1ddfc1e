"""A worker that starts alone after the only other one died takes what the dead one left at its
first look, without first watching the dead holders for the grace: Redis's own record (the
presence epoch's age) says how long each has been absent. A holder that record shows present
within the grace is still given the rest of its grace (maybe a blip of a live holder), and one
whose connection is open is never taken, however old its record (a stopped process). Judged
from Postgres, the worker's own report of its look and the model server's records."""

from __future__ import annotations

import time

import pytest
import redis

from runtime.fleet.presence import (
    EPOCH_TTL_MS,
    STALE_MS,
    absent_for_ms,
    connection_name,
    epoch_key,
    new_epoch,
)
from runtime.recovery.deaths import DeathWatch
from runtime.recovery.deps import RecoveryDeps
from runtime.services import holder_of
from tests.support.judge import judge_runs
from tests.support.scripts import mixed
from tests.support.stack import RecordingPublisher, services_with

pytestmark = pytest.mark.kill

# The victim dies right after its second step's checkpoint (the model's answer to step 2 is
# written): the model must not be asked for step 2 again (I5).
KILL_AFTER_STEP_2 = "after_checkpoint:kill:2"
# The survivor's death watch looks once at start, and not again within the test: only a first
# look that takes the dead holders at once can resume the run.
ONE_LOOK = {"LIYAGENT_DEATH_POLL_MS": "600000"}


def _absent_past_grace(stack, holders: set[str]) -> bool:
    """Whether Redis's own record shows every one of these holders absent past the grace
    (what a starting death watch reads; no clock of the test's own)."""
    client = stack.services.redis
    ns = stack.settings.namespace
    grace = stack.settings.timings.death_grace_ms
    ages = []
    for holder in holders:
        key = epoch_key(ns, holder)
        raw = client.get(key)
        ages.append(absent_for_ms("" if raw is None else raw.decode(), int(client.pttl(key))))
    return all(age >= grace for age in ages)


def _until(check, what: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def test_a_worker_starting_after_the_only_one_died_takes_its_run_at_its_first_look(
    stack,
) -> None:
    victim = stack.worker("victim", fault=KILL_AFTER_STEP_2)
    holders = {holder_of(pid) for pid in [victim.popen.pid, *victim.children()]}
    run_id = stack.start(mixed("alone", latency_ms=200))
    stack.fault_hit("victim")
    victim.popen.wait(timeout=10)
    assert stack.client.get(run_id).status == "running"  # lost mid-run, nobody to take it
    _until(lambda: _absent_past_grace(stack, holders), "Redis never recorded the victim gone")

    survivor = stack.worker("survivor", env=ONE_LOOK, sweeps=False)
    # Its one look took the dead holders' work: the run is claimed by the survivor's watch.
    survivor.wait_for(rf'"claimed": \[[^\]]*"{run_id}"[^\n]*"deaths.taken"', timeout=30)
    view = stack.wait(run_id, timeout=60)
    assert view.status == "succeeded" and view.lost_count == 1 and view.attempt == 2
    survivors = {holder_of(pid) for pid in [survivor.popen.pid, *survivor.children()]}
    (row,) = stack.rows("SELECT claimed_by FROM runs WHERE id = :r", r=run_id)
    assert row.claimed_by in survivors  # resumed by the new worker
    assert stack.asked(run_id) == {1: 1, 2: 1, 3: 1, 4: 1}  # no model step asked twice (I5)
    judge_runs(stack, [run_id]).assert_clean()


def _ghost(stack, run_id: str, holder: str, absent_ms: int) -> None:
    """A holder with a reserved message whose presence epoch Redis last saw refreshed
    `absent_ms` past the refresh bound (a dead process leaves this behind, with no connection)."""
    client = stack.services.redis
    stack.services.leases.reserve(holder, run_id, 1)
    key = epoch_key(stack.settings.namespace, holder)
    client.set(key, new_epoch(), px=EPOCH_TTL_MS - STALE_MS - absent_ms)


def test_a_starting_watch_takes_at_once_only_holders_absent_past_the_grace_by_redis_record(
    stack,
) -> None:
    grace = stack.settings.timings.death_grace_ms
    leases = stack.services.leases
    # This Redis's epoch has republished what it had to (else every queued run goes again).
    leases.mark_epoch(leases.store_epoch(), "requeued")
    # No worker: the runs stay queued, each reserved by one holder that has no worker either.
    gone, blipped, stopped = (stack.start(mixed(tag)) for tag in ("g", "b", "s"))
    _ghost(stack, gone, "ghost-1", absent_ms=grace + 500)  # died a while ago
    _ghost(stack, blipped, "ghost-2", absent_ms=0)  # refreshed just now: maybe a blip
    _ghost(stack, stopped, "ghost-3", absent_ms=grace + 500)  # stale, but its connection is open
    connected = redis.Redis.from_url(
        stack.settings.redis_url, client_name=connection_name("ghost-3")
    )
    connected.ping()
    publisher = RecordingPublisher()
    s = services_with(stack, publisher)
    watch = DeathWatch(RecoveryDeps.of(s), s.presence)
    try:
        first = watch.poll()
        assert first.ran and first.dead == ["ghost-1"] and first.republished == [gone]
        # The one refreshed just now is given the grace from this look, then taken (it never
        # came back); the stopped one, whose connection stays open, never is.
        taken: list[str] = []
        _until(lambda: bool(taken.extend(watch.poll().dead) or taken), "ghost-2 never taken")
        assert taken == ["ghost-2"]
        assert watch.poll().dead == []
        assert sorted(publisher.sent) == sorted([(gone, 1), (blipped, 1)])
        # Reserved by a dead process: they had reached the head of the queue, and go back there.
        assert publisher.redelivered == {(gone, 1): True, (blipped, 1): True}
    finally:
        connected.close()
        s.presence.stop()
        s.redis.close()
