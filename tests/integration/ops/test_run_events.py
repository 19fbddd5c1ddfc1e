"""A run's events, derived from Postgres alone, with real workers: their order for a run with
write calls, the seam of a SIGKILL (`lost` then `resumed`, nothing repeated), sequence numbers
stable across reads and only ever appended, and a follower woken by the engine's nudge."""

from __future__ import annotations

import json
import threading
from typing import Any

import pytest

from runtime.ops.events import EventKind, RunEvent, follow, read_events
from tests.support.scripts import call, final, mixed, step

# Killed after marking its third write (chat.reply, no reader) and before sending it: the
# resume settles it `unknown` and never sends it again.
FAULT = "after_mark:kill:3"


def _kinds(events: tuple[RunEvent, ...] | list[RunEvent]) -> list[str]:
    return [e.kind.value for e in events]


def _same(a: RunEvent, b: RunEvent) -> bool:
    return (a.seq, a.kind, a.at, a.attempt, a.step, a.details) == (
        b.seq,
        b.kind,
        b.at,
        b.attempt,
        b.step,
        b.details,
    )


def _identity(e: RunEvent) -> tuple[Any, ...]:
    """What makes two events the same event (a repeat would have the same identity)."""
    return (e.kind, e.attempt, e.step, e.details.get("call_index"), e.at)


@pytest.mark.timeout(120)
def test_events_of_a_run_with_a_write_call_in_order(stack) -> None:
    stack.worker()
    run_id = stack.start([step(call("c1", "incident.create", title="Disk full")), final()])
    assert stack.wait(run_id).status == "succeeded"
    page = stack.client.events(run_id)
    assert _kinds(page.events) == [
        "queued",
        "claimed",
        "step_written",
        "call_marked",
        "call_made",
        "answered",
        "delivered",
    ]
    assert [e.seq for e in page.events] == list(range(1, 8)) and page.done
    marked, made = page.events[3], page.events[4]
    assert marked.details["tool"] == made.details["tool"] == "incident.create"
    assert made.details["settlement"] == "made" and marked.step == made.step == 1
    assert page.events[1].details["worker"]  # the worker process that claimed it
    # A written step and the answer say what they used, as written with them (the ledger).
    (row,) = stack.rows(
        "SELECT s.input_tokens, s.output_tokens, s.model, r.answer_input_tokens, "
        "r.answer_output_tokens FROM run_steps s JOIN runs r ON r.id = s.run_id "
        "WHERE s.run_id = :r AND s.step = 1",
        r=run_id,
    )
    used, answered = page.events[2].details["usage"], page.events[5].details["usage"]
    assert (used["input_tokens"], used["output_tokens"]) == (row.input_tokens, row.output_tokens)
    assert used["input_tokens"] > 0 and used["model"] == row.model
    assert answered["input_tokens"] == row.answer_input_tokens > 0
    assert answered["output_tokens"] == row.answer_output_tokens
    assert all(e.attempt == 1 for e in page.events)
    assert all(a.at <= b.at for a, b in zip(page.events, page.events[1:], strict=False))
    # A page after a seq holds only what follows it; after the last, nothing.
    later = stack.client.events(run_id, after=4)
    assert [e.seq for e in later.events] == [5, 6, 7]
    assert all(_same(a, b) for a, b in zip(later.events, page.events[4:], strict=True))
    assert stack.client.events(run_id, after=7).events == ()


@pytest.mark.kill
@pytest.mark.timeout(180)
def test_killed_run_shows_lost_then_resumed_nothing_repeated(stack) -> None:
    """SIGKILL mid-run: the events read while the run is lost and after it finished agree on
    every seq they share (appended only), and the seam is visible once."""
    stack.worker("victim", fault=FAULT, pool="prefork")
    run_id = stack.start(mixed("k", latency_ms=200))
    stack.fault_hit("victim")
    stack.procs[-1].popen.wait(timeout=10)
    before = read_events(stack.engine, run_id).events  # read while nobody holds the run
    assert "lost" not in _kinds(before)
    stack.worker("survivor")
    stack.beat()
    assert stack.wait(run_id).status == "succeeded"
    events = read_events(stack.engine, run_id).events
    again = read_events(stack.engine, run_id).events
    assert all(_same(a, b) for a, b in zip(events, again, strict=True))  # stable across reads
    # Appended only: everything seen before the loss keeps its seq and its content.
    assert all(_same(a, b) for a, b in zip(before, events[: len(before)], strict=True))
    kinds = _kinds(events)
    assert kinds.count("lost") == 1 and kinds.count("resumed") == 1
    lost, resumed = kinds.index("lost"), kinds.index("resumed")
    # The survivor's claim, the call the resume settled (its record comes first), the resume.
    assert kinds[lost + 1 : resumed + 1] == ["claimed", "call_settled", "resumed"]
    assert events[lost].attempt == 1 and events[resumed].attempt == 2
    assert events[lost].details["worker"] == events[1].details["worker"]  # the victim
    assert events[lost + 1].details["worker"] != events[1].details["worker"]
    assert [c["settled"] for c in events[resumed].details["calls"]] == ["unknown"]
    # Each event once: nothing of attempt 1 is told again after the seam.
    ids = [_identity(e) for e in events]
    assert len(ids) == len(set(ids))
    assert [e.seq for e in events] == list(range(1, len(events) + 1))
    settled = [e for e in events if e.kind == EventKind.CALL_SETTLED]
    assert [(e.details["tool"], e.details["settlement"], e.attempt) for e in settled] == [
        ("chat.reply", "unknown", 2)
    ]
    marked = [e for e in events if e.kind == EventKind.CALL_MARKED]
    assert [e.details["tool"] for e in marked] == ["incident.create", "issue.comment", "chat.reply"]
    assert all(e.attempt == 1 for e in marked)  # marked by the lost attempt, kept there
    assert kinds[-2:] == ["answered", "delivered"]


@pytest.mark.timeout(120)
def test_a_follower_is_woken_by_the_engine(stack) -> None:
    """A follower started before the run has a worker sees every event as it is recorded, in
    order, and ends once the run ended."""
    run_id = stack.start([step(call("c1", "incident.create", title="x")), final()])
    seen: list[RunEvent] = []
    done = threading.Event()

    def watch() -> None:
        for event in follow(stack.engine, stack.services.changes, run_id):
            seen.append(event)
        done.set()

    threading.Thread(target=watch, daemon=True).start()
    stack.worker()
    assert stack.wait(run_id).status == "succeeded"
    assert done.wait(10), "the follower did not end with the run"
    assert [e.seq for e in seen] == list(range(1, len(seen) + 1))
    assert _kinds(seen)[-1] == "delivered"
    assert stack.services.changes.watching() == 0


@pytest.mark.timeout(120)
def test_cli_watch_shows_the_events_and_ends_with_the_run(stack) -> None:
    import subprocess
    import sys
    import uuid

    from liyagent.local.procs import ROOT

    stack.worker()
    run_id = stack.start([step(call("c1", "incident.create", title="x")), final()])
    argv = [sys.executable, "-m", "liyagent", "watch"]
    done = subprocess.run(
        [*argv, run_id], env=stack.env, cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    for word in ("queued", "claimed", "step_written", "call_marked", "call_made", "delivered"):
        assert word in done.stdout, word
    assert f"run {run_id} succeeded" in done.stdout
    # --json: one event a line, the same events, and the run's outcome as the exit code.
    as_json = subprocess.run(
        [*argv, run_id, "--json"], env=stack.env, cwd=ROOT, capture_output=True, text=True,
        timeout=60,
    )  # fmt: skip
    assert as_json.returncode == 0, as_json.stderr
    lines = [json.loads(line) for line in as_json.stdout.splitlines()]
    assert [e["seq"] for e in lines] == list(range(1, len(lines) + 1))
    assert lines[0]["kind"] == "queued" and lines[-1]["kind"] == "delivered"
    unknown = str(uuid.uuid4())
    bad = subprocess.run(
        [*argv, unknown], env=stack.env, cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert bad.returncode != 0 and f"run {unknown} does not exist" in bad.stderr
    assert "Traceback" not in bad.stderr
