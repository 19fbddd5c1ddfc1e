"""Run events' pure parts: a Last-Event-ID that is not a seq is refused; a run failed while
queued was never claimed; the order of a loss's seam."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from runtime.core.enqueue import BadRequest
from runtime.entries.client import parse_after
from runtime.ops.events import derive
from store.events import AuditFact, RunFact, RunFacts

T0 = datetime(2026, 12, 2, tzinfo=UTC)


def _t(ms: int) -> datetime:
    return T0 + timedelta(milliseconds=ms)


@pytest.mark.parametrize("raw", ["-1", "abc", "1.5", "", " ", True, "9" * 19])
def test_a_bad_seq_is_refused(raw: object) -> None:
    with pytest.raises(BadRequest, match="not an event sequence number"):
        parse_after(raw)


def test_a_good_seq_is_read() -> None:
    assert parse_after("7") == 7 and parse_after(0) == 0


def test_a_run_failed_while_queued_was_never_claimed() -> None:
    run = RunFact("failed", 1, _t(0), None, None, None, _t(5), "stopped", _t(9))
    failed = AuditFact(1, "agent.run.failed", 1, 0, {"code": "stopped"}, _t(5))
    kinds = [e.kind.value for e in derive(RunFacts("r", run, (failed,), (), (), ()))]
    assert kinds == ["queued", "failed"]


def test_a_loss_opens_the_next_attempt_whatever_its_time() -> None:
    """The loss's claim may carry an earlier time than the lost attempt's last record (its
    transaction began first and waited): it still comes after everything of attempt 1."""
    run = RunFact("queued", 2, _t(0), "w1", _t(10), None, None, None, _t(99))
    resumed_rec = AuditFact(
        2, "agent.run.lost", 2, 0, {"lost_attempt": 1, "lost_holder": "w1"}, _t(15)
    )
    error = AuditFact(1, "agent.run.error", 1, 0, {"worker": "w1"}, _t(20))
    events = derive(RunFacts("r", run, (error, resumed_rec), (), (), ()))
    assert [(e.kind.value, e.attempt) for e in events] == [
        ("queued", 1),
        ("claimed", 1),
        ("error", 1),
        ("lost", 1),
    ]
    assert [e.seq for e in events] == [1, 2, 3, 4]
