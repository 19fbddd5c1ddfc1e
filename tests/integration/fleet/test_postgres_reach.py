"""A process cut from Postgres alone gives its leases up, and only then (real Postgres, Redis):
its probe is judged against the other holders' answered probes, stamped in Redis."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from liyagent.local.servers import free_port
from runtime.fleet.heartbeat import Heartbeat, LeaseLost
from runtime.fleet.leases import Leases, Token, fence_token, monotonic_ms
from runtime.fleet.reach import PostgresReach
from store import db

BOUND_MS = 300


@pytest.fixture
def leases(stack) -> Leases:
    return Leases(stack.services.redis, stack.settings.namespace, ttl_ms=5000)


_engines: list[db.sa.Engine] = []


@pytest.fixture(autouse=True)
def _dispose() -> Iterator[None]:
    yield
    while _engines:
        _engines.pop().dispose()


def _reach(leases: Leases, holder: str, url: str) -> PostgresReach:
    engine = db.probe_engine(url)
    _engines.append(engine)
    return PostgresReach(
        lambda: db.ping(engine), leases, holder, interval_ms=100, bound_ms=BOUND_MS, attempt_ms=500
    )


def _dead_url(stack) -> str:
    """The same database at a port nobody listens on: every probe is refused."""
    return (
        db.sa.make_url(stack.settings.database_url)
        .set(host="127.0.0.1", port=free_port())
        .render_as_string(hide_password=False)
    )


def test_cut_off_only_while_another_holder_reaches_postgres(stack, leases) -> None:
    cut = _reach(leases, "cut", _dead_url(stack))
    other = _reach(leases, "other", stack.settings.database_url)
    cut.probe()
    time.sleep(BOUND_MS / 1000 + 0.05)
    cut.probe()
    assert not cut.cut_off(), "nobody else reached Postgres: the leases are kept (a failover)"
    other.probe()  # answered, after the cut process's failures began
    assert not cut.cut_off(), "no probe of the cut process failed after the other's answer"
    time.sleep(0.02)  # the two clocks are read in whole milliseconds
    cut.probe()
    assert cut.cut_off()
    time.sleep(other.fresh_ms / 1000 + 0.05)
    cut.probe()
    assert not cut.cut_off(), "the other holder's answer is stale: it may be cut off too"
    assert not other.cut_off()


def test_a_holder_answered_lately_is_not_cut_off(stack, leases) -> None:
    live = _reach(leases, "live", stack.settings.database_url)
    other = _reach(leases, "other", stack.settings.database_url)
    live.probe()
    other.probe()
    assert not live.cut_off()


def test_let_go_loses_every_lease_first_and_fences_it_for_the_sweep(stack, leases) -> None:
    heartbeat = Heartbeat(leases, interval_ms=1000, stall_ms=60_000)
    tokens = [Token(f"r{i}", 1, "cut") for i in range(2)]
    held = []
    for token in tokens:
        assert leases.acquire(token)
        held.append(heartbeat.hold(token, monotonic_ms()))
    heartbeat.let_go_all()
    for lease in held:
        with pytest.raises(LeaseLost):
            lease.check()
    assert leases.holders([t.run_id for t in tokens]) == [str(fence_token(t)) for t in tokens]
    assert sorted(map(str, leases.given_up())) == sorted(map(str, tokens))
    assert leases.lapsed() == []  # given up, not lapsed: the sweep claims it as a store fault
    heartbeat.stop()
