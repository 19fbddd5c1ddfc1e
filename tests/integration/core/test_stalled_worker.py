"""A worker stalled past its lease is taken over; when it wakes it writes nothing more (I3)."""

from __future__ import annotations

import os
import signal
import time

import pytest

from tests.support.scripts import mixed

# What an attempt writes, and when: its checkpoint (on the run's row), marks, audit events.
STALE_WRITES = {
    "checkpoint": "SELECT count(*) AS n FROM runs WHERE id = :r AND checkpoint_attempt = 1 "
    "AND checkpointed_at > :t",
    "call_marks": "SELECT count(*) AS n FROM call_marks WHERE run_id = :r AND attempt = 1 "
    "AND marked_at > :t",
    "audit_events": "SELECT count(*) AS n FROM audit_events WHERE run_id = :r AND attempt = 1 "
    "AND created_at > :t",
}


@pytest.mark.kill
@pytest.mark.parametrize(
    ("fault", "pool"),
    [
        ("after_mark:stop", "prefork"),
        ("after_checkpoint:stop", "prefork"),
        ("after_send:stop", "prefork"),
        # Stopped after its lease check, just before the request leaves: on waking, the send
        # guard (the lease's local deadline, checked as the bytes leave) refuses it.
        ("before_send:stop", "prefork"),
        # Under threads the whole worker stops (its heartbeat and death watch with it): the
        # lease lapses, and on waking every thread is fenced or refused by the send guard.
        ("after_mark:stop", "threads"),
        # Stopped at the same place from a pool thread: the stop lands on that thread at the
        # point (runtime/base/faults.py), so on waking its request is refused whole, headers
        # included.
        ("before_send:stop", "threads"),
    ],
)
def test_stalled_worker_writes_nothing_after_takeover(stack, fault: str, pool: str) -> None:
    victim = stack.worker("victim", fault=fault, pool=pool)
    run_id = stack.start(mixed("s"))
    stopped_pid = int(stack.fault_hit("victim").split()[1])
    stack.worker("survivor", pool=pool)
    stack.beat()
    view = stack.wait(run_id, timeout=60)
    assert view.status == "succeeded" and view.attempt == 2 and view.lost_count == 1
    taken_over = stack.rows(
        "SELECT created_at FROM audit_events WHERE run_id = :r AND kind = 'agent.run.lost'",
        r=run_id,
    )[0].created_at
    before = _snapshot(stack, run_id)

    os.kill(stopped_pid, signal.SIGCONT)
    victim.wait_for(r"run\.fenced_out", timeout=30)

    after = _snapshot(stack, run_id)
    new = [sorted(set(a) - set(b), key=str) for a, b in zip(after, before, strict=True)]
    assert after == before, f"the stale attempt wrote after it woke: {new}"
    stale = stack.vendor(
        "SELECT count(*) AS n FROM sim.requests WHERE run_id = :r AND "
        "attempt = 1 AND created_at > :t",
        r=run_id,
        t=taken_over,
    )[0].n
    assert stale == 0, "the stale attempt reached a vendor after it was taken over"
    for what, sql in STALE_WRITES.items():
        n = stack.rows(sql, r=run_id, t=taken_over)[0].n
        assert n == 0, f"{what}: written by attempt 1 after the takeover"
    # The writes of the run reached their vendors once each.
    counts = stack.vendor(
        "SELECT vendor, count(*) AS n FROM sim.requests WHERE run_id = :r "
        "AND method = 'POST' AND NOT deduped AND vendor <> 'model' GROUP BY vendor",
        r=run_id,
    )
    assert {c.vendor: c.n for c in counts} == {"incidents": 1, "issues": 1, "chat": 1}


def _snapshot(stack, run_id: str) -> tuple:
    run = stack.rows(
        "SELECT status, attempt, step, answer, updated_at FROM runs WHERE id = :r", r=run_id
    )
    cps = stack.rows(
        "SELECT step, checkpoint_attempt, checkpoint, checkpointed_at FROM runs WHERE id = :r",
        r=run_id,
    )
    marks = stack.rows(
        "SELECT step, call_index, status, attempt, outcome FROM call_marks "
        "WHERE run_id = :r ORDER BY step, call_index",
        r=run_id,
    )
    audit = stack.rows("SELECT id FROM audit_events WHERE run_id = :r ORDER BY id", r=run_id)
    transcript = stack.client.transcript(run_id)
    vendor = stack.vendor(
        "SELECT id, vendor, method, path, attempt, call, status FROM sim.requests"
        " WHERE run_id = :r ORDER BY id",
        r=run_id,
    )
    return (tuple(run), tuple(cps), tuple(marks), tuple(audit), tuple(transcript), tuple(vendor))


@pytest.mark.kill
def test_a_stalled_workers_run_is_swept_while_every_survivor_slot_is_busy(stack) -> None:
    """Sweeps are the worker's own (a thread of its main process), not messages behind runs:
    with no beat and no ops queue consumed, and the survivor's only slot busy with a long run,
    the stalled victim's run is still claimed once its lease lapses, by the survivor."""
    victim = stack.worker("victim", fault="after_mark:stop", concurrency=1, ops=False)
    stalled = stack.start(mixed("stalled"))
    stack.fault_hit("victim")
    stack.worker("survivor", concurrency=1, ops=False)
    busy = stack.start(mixed("busy", latency_ms=3000))
    # The survivor's slot is busy before the victim stalls: a worker that becomes ready looks at
    # once for absent peers, so stalling the victim first would let that look claim the run
    # before the busy one was taken.
    _wait_running(stack, busy)
    victim.signal_group(signal.SIGSTOP)  # its main process too: it neither sweeps nor watches
    try:
        deadline = time.monotonic() + 60
        while stack.client.get(stalled).attempt < 2:
            assert time.monotonic() < deadline, "the stalled run was never claimed"
            time.sleep(0.1)
        # Claimed while the survivor's one slot still held the busy run.
        assert stack.client.get(busy).status == "running"
        lost = stack.rows(
            "SELECT detail->>'seen' AS seen FROM audit_events WHERE run_id = :r "
            "AND kind = 'agent.run.lost'",
            r=stalled,
        )
        # By a sweep (the victim's connections stayed open): the survivor's, the victim's
        # whole group being stopped.
        assert [r.seen for r in lost] == ["lease_lapsed"]
    finally:
        victim.signal_group(signal.SIGCONT)
    for run_id in (stalled, busy):
        assert stack.wait(run_id, timeout=90).status == "succeeded"


def _wait_running(stack, run_id: str) -> None:
    deadline = time.monotonic() + 60
    while stack.client.get(run_id).status != "running":
        assert time.monotonic() < deadline, f"run {run_id} never started"
        time.sleep(0.05)
