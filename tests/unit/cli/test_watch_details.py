"""`liyagent watch` says what a run waiting for its model endpoint waits for: the endpoint,
the reason, the limit and until when, and a 429's Retry-After (issue 33, item 5)."""

from __future__ import annotations

from datetime import UTC, datetime

from liyagent.cli.watch import _details
from runtime.flow.waiting import ModelWait
from runtime.ops.events import EventKind, RunEvent

AT = datetime(2026, 12, 6, 17, 0, tzinfo=UTC)


def test_a_wait_in_place_and_a_429_show_their_endpoint_and_reason() -> None:
    wait = ModelWait.of("gpt", 1_500, "requests", AT.timestamp())
    waited = RunEvent("r", 3, EventKind.ENDPOINT_WAIT, AT, 1, 2, wait.details(1_500, True))
    shown = _details(waited)
    for part in ("endpoint=gpt", "reason=limited", "limit=requests", "wait_ms=1500"):
        assert part in shown, shown
    assert "until=2026-12-06T17:00:01.500000+00:00" in shown, shown
    details = {"endpoint": "gpt", "retry_after_s": 2.0, "closed_ms": 2000}
    met = RunEvent("r", 2, EventKind.RATE_LIMITED, AT, 1, 2, details)
    assert _details(met) == "endpoint=gpt retry_after_s=2.0"


def test_a_definition_drift_shows_its_pin_policy_and_what_changed() -> None:
    gone = {"what": "tool", "name": "desk.refund", "change": "gone", "was": "write", "now": None}
    details = {"pin": "3f09", "policy": "pinned", "changes": [gone]}
    drift = RunEvent("r", 4, EventKind.DEFINITION_DRIFT, AT, 2, 1, details)
    assert _details(drift) == "pin=3f09 policy=pinned changes=desk.refund gone"
