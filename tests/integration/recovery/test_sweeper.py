"""The sweeper claims each lapsed run exactly once, and Postgres is the outbox (I1, I4)."""

from __future__ import annotations

import random
import threading
import time
from dataclasses import replace

import redis

from bench.bulk import insert_running_runs
from runtime.base.settings import Timings
from runtime.base.tenancy import HIGH, LOW
from runtime.entries.client import Client
from runtime.fleet.leases import Leases, Token
from runtime.flow.order import bucket_keys
from runtime.recovery.deps import RecoveryDeps
from runtime.recovery.sweeper import Sweeper
from store.losses import claim_lost, claim_lost_many
from store.runs import claim_delivery
from tasks.deliveries import held_runs
from tests.support.scripts import final
from tests.support.stack import RecordingPublisher, services_with


def _running_with_lapsed_lease(stack, services) -> str:
    """A run claimed by a worker that then died: running in Postgres, lease gone."""
    run_id = Client(services).start_run(
        agent="bot", model={"script": {"steps": [final()]}}, user_input="x"
    )
    short = Leases(services.redis, services.settings.namespace, ttl_ms=150)
    assert short.acquire(Token(run_id, 1, "dead-worker"))
    with stack.db() as conn:
        assert claim_delivery(conn, run_id, 1, "test-worker") is not None
    deadline = time.monotonic() + 5
    while short.holder(run_id) is not None:
        assert time.monotonic() < deadline
        time.sleep(0.02)
    return run_id


def test_racing_claims_on_one_lapsed_run_admit_one(stack) -> None:
    publisher = RecordingPublisher()
    services = services_with(stack, publisher)
    run_id = _running_with_lapsed_lease(stack, services)
    barrier = threading.Barrier(8)
    results = []

    def claim() -> None:
        with stack.engine.connect() as conn:
            barrier.wait()
            results.append(claim_lost(conn, run_id, 1, loss_limit=2))

    threads = [threading.Thread(target=claim) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    won = [r for r in results if r is not None]
    assert len(won) == 1 and won[0].attempt == 2 and won[0].status == "queued"
    lost = stack.rows(
        "SELECT count(*) AS n FROM audit_events WHERE run_id = :r AND kind = 'agent.run.lost'",
        r=run_id,
    )[0].n
    assert lost == 1


def test_racing_batch_claims_in_any_order_claim_each_run_once(stack) -> None:
    # A sweep and the death watch can claim overlapping batches at once, each in its own
    # order: every run is claimed once, and no claimer deadlocks on another's row locks.
    with stack.engine.begin() as conn:
        run_ids = insert_running_runs(conn, 60, holder="dead")
    batches = []
    for seed in range(4):
        batch = [(r, 1) for r in run_ids]
        random.Random(seed).shuffle(batch)
        batches.append(batch)
    barrier = threading.Barrier(len(batches))
    claimed: list[str] = []
    errors: list[BaseException] = []

    def claim(batch: list[tuple[str, int]]) -> None:
        try:
            with stack.engine.begin() as conn:
                barrier.wait()
                claimed.extend(c.run_id for c in claim_lost_many(conn, batch, loss_limit=2))
        except BaseException as exc:  # a deadlock surfaces here
            errors.append(exc)

    threads = [threading.Thread(target=claim, args=(b,)) for b in batches]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert errors == []
    assert sorted(claimed) == sorted(run_ids)
    lost = stack.rows(
        "SELECT count(*) AS n FROM audit_events WHERE kind = 'agent.run.lost' "
        "AND run_id = ANY(CAST(:ids AS uuid[]))",
        ids=list(run_ids),
    )[0].n
    assert lost == len(run_ids)


def test_two_sweepers_racing_requeue_a_lapsed_run_once(stack) -> None:
    publisher = RecordingPublisher()
    services = services_with(stack, publisher)
    run_id = _running_with_lapsed_lease(stack, services)
    publisher.sent.clear()
    # Two sweepers with separate locks, so only Postgres's claim can keep them apart.
    a, b = Sweeper(RecoveryDeps.of(services)), Sweeper(RecoveryDeps.of(services))
    b.lock_key += ":other"
    barrier = threading.Barrier(2)

    def sweep(sweeper: Sweeper) -> None:
        barrier.wait()
        sweeper.sweep()

    threads = [threading.Thread(target=sweep, args=(s,)) for s in (a, b)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert publisher.sent == [(run_id, 2)]
    row = stack.rows("SELECT attempt, lost_count, status FROM runs WHERE id = :r", r=run_id)[0]
    assert (row.attempt, row.lost_count, row.status) == (2, 1, "queued")


def test_sweep_lock_lets_one_sweep_run_at_a_time(stack) -> None:
    services = services_with(stack, RecordingPublisher())
    sweeper = Sweeper(RecoveryDeps.of(services))
    lock = services.redis.lock(sweeper.lock_key, timeout=5)
    assert lock.acquire(blocking=False)
    try:
        assert sweeper.sweep().ran is False
    finally:
        lock.release()
    assert sweeper.sweep().ran is True


def test_unpublished_run_is_republished_from_postgres(stack) -> None:
    dead_broker = RecordingPublisher(fail=True)
    services = services_with(stack, dead_broker)
    run_id = Client(services).start_run(
        agent="bot", model={"script": {"steps": [final()]}}, user_input="x", priority=HIGH
    )
    assert stack.client.get(run_id).status == "queued"
    publisher = RecordingPublisher()
    sweeping = services_with(
        stack, publisher, Timings(lease_ttl_ms=3000, heartbeat_ms=900, requeue_after_ms=0)
    )
    Sweeper(RecoveryDeps.of(sweeping)).sweep()
    assert publisher.sent == [(run_id, 1)]
    assert publisher.priorities[(run_id, 1)] == HIGH, "the outbox kept the run's priority"
    # Stamped: the next sweep does not publish it again straight away.
    sweeping2 = services_with(
        stack, publisher, Timings(lease_ttl_ms=3000, heartbeat_ms=900, requeue_after_ms=60_000)
    )
    Sweeper(RecoveryDeps.of(sweeping2)).sweep()
    assert publisher.sent == [(run_id, 1)]


def test_the_outbox_publishes_again_only_runs_whose_message_waits_nowhere(stack) -> None:
    # A backlog: every run waits longer than the outbox's bound with its message in the
    # queue; publishing each again would add a message per waiting run at every bound. Only
    # the run whose message no queue holds (its publish was lost) is published again.
    leases = stack.services.leases
    leases.mark_epoch(leases.store_epoch(), "requeued")
    waiting, lost = (stack.start([final(tag)]) for tag in ("waiting", "lost"))
    client = stack.services.redis
    [key] = [
        k for k in bucket_keys(stack.settings.namespace + stack.settings.queue) if client.llen(k)
    ]
    assert client.lpop(key) is not None  # the newest: `lost`'s message
    publisher = RecordingPublisher()
    sweeping = services_with(
        stack, publisher, Timings(lease_ttl_ms=3000, heartbeat_ms=900, requeue_after_ms=0)
    )
    traced = held_runs(client, stack.settings.namespace, stack.settings.queue)
    Sweeper(RecoveryDeps.of(sweeping), traced=traced).sweep()
    assert publisher.sent == [(lost, 1)]
    assert publisher.redelivered == {(lost, 1): False}, "never taken: at its run's priority"
    assert stack.client.get(waiting).status == "queued"


def test_worker_dead_between_lease_and_claim_is_republished(stack) -> None:
    publisher = RecordingPublisher()
    services = services_with(stack, publisher)
    # This Redis has republished what it had to (else every queued run goes again as lost).
    services.leases.mark_epoch(services.leases.store_epoch(), "requeued")
    run_id = Client(services).start_run(
        agent="bot", model={"script": {"steps": [final()]}}, user_input="x", priority=LOW
    )
    short = Leases(services.redis, services.settings.namespace, ttl_ms=100)
    assert short.acquire(Token(run_id, 1, "dead-worker"))
    deadline = time.monotonic() + 5
    while short.holder(run_id) is not None:
        assert time.monotonic() < deadline
        time.sleep(0.02)
    publisher.sent.clear()
    Sweeper(RecoveryDeps.of(services)).sweep()
    assert publisher.sent == [(run_id, 1)]
    assert publisher.priorities[(run_id, 1)] == LOW, "published again at its run's priority"
    assert publisher.redelivered[(run_id, 1)], "taken once: at the head of the queue"
    assert stack.client.get(run_id).attempt == 1  # not a loss: it never ran


def _forget_everything(services) -> None:
    """Redis restarted empty: every lease, index entry and the store epoch are gone (the
    services' own presence connection stays, as a live process reconnects)."""
    client = redis.Redis.from_url(services.settings.redis_url)
    keys = list(client.scan_iter(match=f"{services.settings.namespace}*"))
    client.delete(*keys)


def _sweep_after_the_store_grace(services, sweeper: Sweeper):
    """Sweep, within the grace after Redis came back (nothing without a lease is claimed),
    then once the grace has passed."""
    first = sweeper.sweep()
    assert first.settling and first.claimed == first.store_faulted == []
    grace_s = services.settings.timings.store_grace_ms / 1000
    time.sleep(grace_s)  # the test waits out the grace; the engine never sleeps on it
    return sweeper.sweep()


def test_redis_losing_its_data_is_reconciled_from_postgres(stack) -> None:
    publisher = RecordingPublisher()
    services = services_with(stack, publisher)
    sweeper = Sweeper(RecoveryDeps.of(services))
    sweeper.sweep()  # sets the epoch marker
    run_id = Client(services).start_run(
        agent="bot", model={"script": {"steps": [final()]}}, user_input="x"
    )
    lease = Token(run_id, 1, "worker")
    assert services.leases.acquire(lease)
    with stack.db() as conn:
        claim_delivery(conn, run_id, 1, "test-worker")
    _forget_everything(services)
    publisher.sent.clear()
    report = _sweep_after_the_store_grace(services, sweeper)
    assert report.full_scan and report.claimed == [run_id]
    assert publisher.sent == [(run_id, 2)]
    # Its holder never came back (no connection of it): a loss, charged.
    assert stack.client.get(run_id).lost_count == 1


def test_a_run_whose_live_holder_lost_its_lease_with_redis_is_resumed_uncharged(stack) -> None:
    """Redis lost its data and the holder's process lives (connected) but did not take its
    lease back: the run is claimed as a store fault, audited so, with no loss charged."""
    publisher = RecordingPublisher()
    services = services_with(stack, publisher)
    services.presence.start()  # this process is the live holder
    sweeper = Sweeper(RecoveryDeps.of(services))
    run_id = Client(services).start_run(
        agent="bot", model={"script": {"steps": [final()]}}, user_input="x"
    )
    assert services.leases.acquire(Token(run_id, 1, services.holder))
    with stack.db() as conn:
        claim_delivery(conn, run_id, 1, services.holder)
    _forget_everything(services)
    publisher.sent.clear()
    report = _sweep_after_the_store_grace(services, sweeper)
    assert report.store_faulted == [run_id] and report.claimed == []
    assert publisher.sent == [(run_id, 2)]
    run = stack.client.get(run_id)
    assert (run.attempt, run.lost_count) == (2, 0)
    audits = stack.rows(
        "SELECT kind, detail->>'reason' AS reason FROM audit_events WHERE run_id = :r "
        "AND kind IN ('agent.run.lost', 'agent.run.store_fault')",
        r=run_id,
    )
    assert [(a.kind, a.reason) for a in audits] == [("agent.run.store_fault", "store_fault")]
    # The fence is gone once the claim is done: the next attempt takes its lease at once.
    assert services.leases.acquire(Token(run_id, 2, "next-worker"))


def test_queued_runs_are_published_again_as_soon_as_redis_comes_back_empty(stack) -> None:
    publisher = RecordingPublisher()
    services = services_with(stack, publisher)
    sweeper = Sweeper(RecoveryDeps.of(services))
    run_id = Client(services).start_run(
        agent="bot", model={"script": {"steps": [final()]}}, user_input="x"
    )
    sweeper.sweep()  # this Redis's epoch: the run's message is in it
    publisher.sent.clear()
    sweeper.sweep()
    assert publisher.sent == []
    _forget_everything(services)  # and its message with it
    report = sweeper.sweep()  # long before the outbox's requeue_after_ms
    assert publisher.sent == [(run_id, 1)] and report.republished == [run_id]
    publisher.sent.clear()
    sweeper.sweep()
    assert publisher.sent == []  # once per epoch


def test_live_lease_is_never_claimed(stack) -> None:
    publisher = RecordingPublisher()
    services = services_with(stack, publisher)
    run_id = Client(services).start_run(
        agent="bot", model={"script": {"steps": [final()]}}, user_input="x"
    )
    assert services.leases.acquire(Token(run_id, 1, "alive"))
    with stack.db() as conn:
        claim_delivery(conn, run_id, 1, "test-worker")
    publisher.sent.clear()
    for _ in range(3):
        report = Sweeper(RecoveryDeps.of(services)).sweep()
        assert report.claimed == []
    assert stack.client.get(run_id).status == "running"


def test_a_lease_running_out_during_a_full_scan_is_a_loss_even_with_its_holder_connected(
    stack,
) -> None:
    """A stopped (SIGSTOPped, stalled) holder keeps its Redis connections open: a lease whose
    TTL runs out between the sweep's read of the lapsed index and its full scan is still a
    loss, charged, never taken for a lease Redis lost (a store fault)."""
    publisher = RecordingPublisher()
    every_sweep_scans = replace(stack.settings.timings, full_scan_every=1)
    services = services_with(stack, publisher, every_sweep_scans)
    services.presence.start()  # the holder's connection stays open, as a stopped one's does
    sweeper = Sweeper(RecoveryDeps.of(services))
    if sweeper.sweep().settling:  # this Redis's first epoch: wait out its grace once
        time.sleep(services.settings.timings.store_grace_ms / 1000)
    run_id = Client(services).start_run(
        agent="bot", model={"script": {"steps": [final()]}}, user_input="x"
    )
    short = Leases(services.redis, services.settings.namespace, ttl_ms=300)
    assert short.acquire(Token(run_id, 1, services.holder))
    with stack.db() as conn:
        assert claim_delivery(conn, run_id, 1, services.holder) is not None
    read_lapsed = services.leases.lapsed

    def lapsed_then_expire(limit: int = 1000) -> list[Token]:
        # The real index read, while the lease still holds; its TTL runs out just after.
        tokens = read_lapsed(limit)
        deadline = time.monotonic() + 5
        while short.holder(run_id) is not None:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        return tokens

    services.leases.lapsed = lapsed_then_expire  # type: ignore[method-assign]
    publisher.sent.clear()
    report = sweeper.sweep()
    assert report.full_scan and report.claimed == [run_id] and report.store_faulted == []
    assert publisher.sent == [(run_id, 2)]
    run = stack.client.get(run_id)
    assert (run.attempt, run.lost_count) == (2, 1)


def test_queued_runs_redis_lost_the_messages_of_are_published_again_at_their_priority(
    stack,
) -> None:
    publisher = RecordingPublisher()
    services = services_with(stack, publisher)
    sweeper = Sweeper(RecoveryDeps.of(services))
    sweeper.sweep()  # sets the epoch marker
    client = Client(services)
    high = client.start_run(
        agent="bot", model={"script": {"steps": [final()]}}, user_input="h", priority=HIGH
    )
    low = client.start_run(
        agent="bot", model={"script": {"steps": [final()]}}, user_input="l", priority=LOW
    )
    publisher.sent.clear()
    _forget_everything(services)
    sweeper.sweep()
    assert sorted(publisher.sent) == sorted([(high, 1), (low, 1)])
    assert publisher.priorities[(high, 1)] == HIGH and publisher.priorities[(low, 1)] == LOW
