"""Redis holds nothing forever for a process that is gone: worker processes started and
stopped (SIGTERM) or killed (SIGKILL, whole group) leave, once the death watch has seen them
dead and a bounded time has passed, no key named after them, and every key left has a TTL or
is one of the fixed set runtime/fleet/keyspace.py documents (issue 31 item 7)."""

from __future__ import annotations

import re
import time

import pytest
import redis

from runtime.fleet.keyspace import BROKER_PREFIXES, FIXED
from runtime.fleet.presence import EPOCH_TTL_S
from runtime.services import holder_of
from tests.support.judge import judge_runs, wait_all
from tests.support.scripts import mixed

pytestmark = pytest.mark.kill

# Past the presence epoch's TTL, with a margin for a loaded machine.
BOUND_S = EPOCH_TTL_S + 10


def _keys(stack) -> dict[str, int]:
    """Every key of the test's namespace (without it), with its TTL in ms (-1: none). A key
    gone between the scan and its TTL (-2: a sweep lock released, a lease let go) is left out:
    there is nothing left to bound."""
    client = redis.Redis.from_url(stack.settings.redis_url)
    ns = stack.settings.namespace
    try:
        keys = {
            key.decode()[len(ns) :]: int(client.pttl(key))
            for key in client.scan_iter(match=f"{ns}*", count=1000)
        }
        return {k: ttl for k, ttl in keys.items() if ttl != -2}
    finally:
        client.close()


def _naming(keys: dict[str, int], holders: set[str]) -> list[str]:
    """Keys whose name carries one of these holders (`<host>-<pid>`, as a whole word)."""
    words = {h: re.compile(rf"(^|[:]){re.escape(h)}($|[:])") for h in holders}
    return sorted(k for k in keys if any(rx.search(k) for rx in words.values()))


def _holders(proc) -> set[str]:
    """The holders of a worker: its main process and its pool's children."""
    return {holder_of(pid) for pid in [proc.popen.pid, *proc.children()]}


def test_stopped_and_killed_workers_leave_no_key_behind(stack) -> None:
    survivor = stack.worker("survivor", concurrency=2)
    victims = {
        "killed_prefork": stack.worker("killed_prefork", pool="prefork", concurrency=2),
        "stopped_prefork": stack.worker("stopped_prefork", pool="prefork", concurrency=2),
        "killed_threads": stack.worker("killed_threads", pool="threads", concurrency=4),
        "stopped_threads": stack.worker("stopped_threads", pool="threads", concurrency=4),
    }
    runs = [stack.start(mixed(f"k{i}", latency_ms=400)) for i in range(10)]
    deadline = time.monotonic() + 60
    while stack.rows("SELECT count(*) AS n FROM runs WHERE status = 'running'")[0].n < 3:
        assert time.monotonic() < deadline, "the runs never got going"
        time.sleep(0.05)
    dead: set[str] = set()
    for name, proc in victims.items():
        dead |= _holders(proc)
        if name.startswith("killed"):
            proc.kill()
        else:
            proc.stop(grace_s=30)
    wait_all(stack, runs, timeout=120)
    judge_runs(stack, runs).assert_clean()
    assert survivor.alive()

    # The death watch has seen them: none is a holder with work any more.
    client = redis.Redis.from_url(stack.settings.redis_url)
    try:
        deadline = time.monotonic() + 30
        ns = stack.settings.namespace
        # Stopped or killed, none is a holder with work or a consumer the watch takes (the
        # stopped leave `holders:consumers` themselves; the killed are taken with their work).
        while dead & {
            m.decode() for m in client.sunion([f"{ns}holders", f"{ns}holders:consumers"])
        }:
            assert time.monotonic() < deadline, "the death watch never took the dead holders"
            time.sleep(0.2)
        consumers = {m.decode() for m in client.smembers(f"{ns}holders:consumers")}
        assert consumers == {holder_of(survivor.popen.pid)}, "only the live worker consumes"
        # The queues the death watch reads after a death: the ones the workers consumed.
        queues = {m.decode() for m in client.smembers(f"{ns}holders:queues")}
        assert queues == {stack.settings.queue, f"{stack.settings.queue}.ops"}
    finally:
        client.close()
    # Then, within a bounded time, no key is named after a process that is gone.
    deadline = time.monotonic() + BOUND_S
    while left := _naming(keys := _keys(stack), dead):
        assert time.monotonic() < deadline, f"keys of dead processes after {BOUND_S} s: {left}"
        time.sleep(0.5)
    # And whatever is left is bounded: a TTL, the fixed set, Celery's own, or a live holder's.
    live = _holders(survivor)
    unbounded = [
        k
        for k, ttl in keys.items()
        if ttl < 0
        and k not in FIXED
        and not k.startswith(BROKER_PREFIXES)
        and k not in {stack.settings.queue, f"{stack.settings.queue}.ops"}
        and not _naming({k: ttl}, live)
    ]
    assert unbounded == [], unbounded
