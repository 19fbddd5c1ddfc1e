"""Leases against real Redis: compare-and-set scripts, and a heartbeat that renews only runs
that make progress (a hung run is let go)."""

from __future__ import annotations

import time

import pytest

from liyagent.local.servers import free_port
from runtime.fleet.heartbeat import Heartbeat, LeaseLost
from runtime.fleet.leases import NO_STEP, Leases, Token, monotonic_ms
from runtime.services import redis_client


@pytest.fixture
def leases(stack) -> Leases:
    return Leases(stack.services.redis, stack.settings.namespace, ttl_ms=600)


def _until(predicate, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.02)


def test_acquire_is_exclusive_and_renew_release_compare_the_token(leases) -> None:
    mine, theirs = Token("r1", 1, "a"), Token("r1", 2, "b")
    assert leases.acquire(mine)
    assert not leases.acquire(theirs)
    assert not leases.renew(theirs)
    assert not leases.release(theirs)
    assert leases.holder("r1") == str(mine)
    assert leases.renew(mine)
    assert leases.release(mine)
    assert leases.holder("r1") is None
    assert leases.lapsed() == []  # the index entry left with the lease


def test_a_lease_redis_forgot_is_taken_back_by_its_token_unless_a_claimer_fenced_it(
    leases,
) -> None:
    mine = Token("r9", 1, "a")
    assert leases.acquire(mine)
    leases.client.delete(leases.key("r9"))  # Redis lost it
    assert leases.renew_or_take_back([mine]) == [2]  # taken back, SET NX of its own token
    assert leases.holder("r9") == str(mine)
    assert leases.renew_or_take_back([mine]) == [1]  # now a plain renewal
    leases.client.delete(leases.key("r9"))
    assert leases.fence_missing([mine]) == [mine]  # the sweeper holds the key to claim it
    assert leases.renew_or_take_back([mine]) == [0]  # so the holder cannot take it back
    assert leases.fence_missing([mine]) == []  # and one fence at a time
    leases.unfence([mine])
    assert leases.holder("r9") is None
    assert leases.acquire(Token("r9", 2, "b"))  # the run's next attempt
    assert leases.renew_or_take_back([mine]) == [0]


def test_lapsed_lease_is_indexed_until_forgotten(leases) -> None:
    token = Token("r2", 1, "a")
    assert leases.acquire(token)
    _until(lambda: leases.holder("r2") is None)
    assert leases.lapsed() == [token]
    leases.forget(token)
    assert leases.lapsed() == []


def test_a_dead_childs_token_is_taken_if_held_or_lapsed_but_never_from_a_newer_attempt(
    leases,
) -> None:
    held, lapsed, old = Token("t1", 1, "c"), Token("t2", 1, "c"), Token("t3", 1, "c")
    newer = Token("t3", 2, "d")
    assert leases.acquire(lapsed)
    assert leases.acquire(newer)
    _until(lambda: leases.holder("t2") is None and leases.holder("t3") is None)
    assert leases.acquire(newer)  # the run moved on: a newer attempt holds it now
    assert leases.acquire(held)
    assert leases.holder("t1") == str(held)  # still held when the parent takes it
    assert leases.take_token(held) and leases.holder("t1") is None
    assert leases.take_token(lapsed)  # lapsed before the parent saw the death: still ours
    assert not leases.take_token(old)
    assert leases.holder("t3") == str(newer)


def test_heartbeat_renews_progressing_runs_and_lets_hung_ones_lapse(leases) -> None:
    beat = Heartbeat(leases, interval_ms=150, stall_ms=400)
    busy, hung = Token("busy", 1, "w"), Token("hung", 1, "w")
    for token in (busy, hung):
        assert leases.acquire(token)
    busy_lease = beat.hold(busy, monotonic_ms())
    hung_lease = beat.hold(hung, monotonic_ms())
    deadline = time.monotonic() + 2.0
    try:
        while time.monotonic() < deadline:
            busy_lease.progress()  # the busy run's own thread keeps moving
            time.sleep(0.05)
    finally:
        beat.stop()
    assert leases.holder("busy") == str(busy)
    assert leases.holder("hung") is None
    with pytest.raises(LeaseLost, match="hung"):
        hung_lease.renew()


def test_renew_raises_once_another_attempt_holds_the_run(leases) -> None:
    beat = Heartbeat(leases, interval_ms=10_000, stall_ms=60_000)
    old = Token("r3", 1, "w")
    assert leases.acquire(old)
    lease = beat.hold(old, monotonic_ms())
    _until(lambda: leases.holder("r3") is None)
    assert leases.acquire(Token("r3", 2, "other"))
    with pytest.raises(LeaseLost):
        lease.renew()
    assert leases.holder("r3") == "r3:2:other"  # never renewed someone else's lease


class _CountingLeases(Leases):
    """Real leases that count the boundary renewals that reach Redis."""

    renewals = 0

    def renew(self, token: Token, written: int = NO_STEP) -> bool:
        self.renewals += 1
        return super().renew(token, written)


def test_boundary_renews_reach_redis_at_most_once_per_fresh_window(stack) -> None:
    leases = _CountingLeases(stack.services.redis, stack.settings.namespace, ttl_ms=3000)
    beat = Heartbeat(leases, interval_ms=400, stall_ms=60_000)  # fresh for 200 ms
    token = Token("fast", 1, "w")
    assert leases.acquire(token)
    lease = beat.hold(token, monotonic_ms())
    try:
        started = time.monotonic()
        while time.monotonic() - started < 1.0:
            lease.renew()  # a run taking steps as fast as it can
            time.sleep(0.005)
        assert 1 <= leases.renewals <= 1.0 / 0.2 + 1
        # Taken over: the next boundary past the window sees it, and renews nothing.
        leases.client.set(leases.key("fast"), "fast:2:other")
        time.sleep(0.25)
        with pytest.raises(LeaseLost):
            lease.renew()
        assert leases.holder("fast") == "fast:2:other"
    finally:
        beat.stop()


def test_unreachable_redis_keeps_the_lease_only_until_it_would_lapse() -> None:
    dead = redis_client(f"redis://127.0.0.1:{free_port()}/0", timeout_s=0.2)
    leases = Leases(dead, "x:", ttl_ms=2500)
    beat = Heartbeat(leases, interval_ms=10_000, stall_ms=60_000)
    lease = beat.hold(Token("r4", 1, "w"), monotonic_ms())
    started = time.monotonic()
    lease.renew()  # unreachable, but the lease cannot have lapsed yet: go on
    assert time.monotonic() - started < 0.5  # the client fails fast; the lease logic decides
    time.sleep(2.1)  # past the lease less the safety margin for the write that follows
    with pytest.raises(LeaseLost, match="unreachable"):
        lease.renew()
    with pytest.raises(LeaseLost):
        lease.check()  # and the local check (no network) agrees from then on
