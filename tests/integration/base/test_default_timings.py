"""The spec's timings, as the product ships them: a lease of 8 s renewed about every third of
it, a fleet-wide sweep every 3 s, a death seen after 1 s. Every other test runs shorter, coupled
timings to stay fast; this one runs a worker with no timing variable set at all, stalls it
(SIGSTOP: its connections stay open, so only its lease can judge it) and times the takeover
from Redis's and Postgres's own clocks: never before the lease lapsed, within a sweep after."""

from __future__ import annotations

import os
import signal

import pytest

from runtime.base.settings import Timings
from tests.support.scripts import mixed
from tests.support.stack import timings_env

# A takeover comes one sweep interval after the lapse at the latest; a loaded test machine may
# add its scheduling delay to that, not to the lapse itself.
SLACK_MS = 1500


def test_the_product_timings_are_the_specs(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in timings_env(Timings()):
        monkeypatch.delenv(name, raising=False)
    t = Timings.from_env()
    assert (t.lease_ttl_ms, t.sweep_interval_ms, t.death_grace_ms) == (8000, 3000, 1000)
    # Renewed about every third of the lease: two renewals may fail before it is lost.
    assert t.lease_ttl_ms / 3 - 100 <= t.heartbeat_ms <= t.lease_ttl_ms / 3
    assert t.loss_limit == 2


@pytest.mark.kill
def test_a_stalled_worker_is_taken_over_8_to_11_s_after_its_last_renewal(stack) -> None:
    stack.reconfigure(timings=Timings())
    stack.unset_env |= set(timings_env(Timings()))  # the worker reads no timing: its defaults
    # Two pool children: one stalls, the other takes the resumed run; the main process's own
    # sweep thread judges the stalled one by its lease (its connections are open).
    worker = stack.worker("w1", fault="after_checkpoint:stop", concurrency=2)
    run_id = stack.start(mixed("dt"))
    stopped_pid = int(stack.fault_hit("w1").split()[1])
    try:
        redis = stack.services.redis
        [(token, deadline_ms)] = [
            (member.decode(), score)
            for member, score in redis.zrange(
                stack.services.leases.deadlines, 0, -1, withscores=True
            )
            if member.decode().startswith(f"{run_id}:1:")
        ]
        view = stack.wait(run_id, timeout=90)
        assert view.status == "succeeded" and view.attempt == 2 and view.lost_count == 1, view
        [lost] = stack.rows(
            "SELECT extract(epoch FROM created_at) * 1000 AS at_ms FROM audit_events "
            "WHERE run_id = :r AND kind = 'agent.run.lost'",
            r=run_id,
        )
    finally:
        os.kill(stopped_pid, signal.SIGCONT)
    last_renewal_ms = deadline_ms - 8000
    taken_ms = float(lost.at_ms) - last_renewal_ms
    # Never before the lease lapsed (the two clocks are this machine's; 50 ms for rounding).
    assert taken_ms >= 8000 - 50, f"taken over {taken_ms:.0f} ms after its last renewal ({token})"
    # Within one sweep (3 s) of the lapse.
    assert taken_ms <= 8000 + 3000 + SLACK_MS, f"taken over {taken_ms:.0f} ms after its renewal"
    worker.wait_for(r"run\.fenced_out", timeout=30)  # on waking, it writes nothing more (I3)
