"""A model step's wait on its endpoint's gate, on a real Redis: open, it asks at once; closed
briefly, it waits in place and its lease shows progress (the heartbeat keeps renewing it);
closed long, a run that may wait suspends on `model:<profile>:<opens at>`, one that may not
waits in place and a warm shutdown hands it back; a 429 met with Redis out of reach is still
waited out by its own worker. Each wait is seen (issue 33, item 5): a wait in place is one
event however many slices, closes and limits it waits through; a suspension says the same words
in its own event; a 429 is an event; each is counted once in the fleet's counters
(`flow:stats`, by the scripts that run anyway) and shows on the step's span."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, NoReturn

import pytest
import redis
import structlog
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from redis.backoff import NoBackoff
from redis.retry import Retry

from runtime.base import drain
from runtime.base.tracing import Tracing
from runtime.core.model_gate import (
    RATE_LIMITED_EVENT,
    SLICE_MS,
    WAIT_EVENT,
    WAIT_IN_PLACE_MAX_MS,
    EndpointWait,
)
from runtime.core.waiting import Suspend
from runtime.fleet.heartbeat import RunLease
from runtime.fleet.leases import Leases, monotonic_ms
from runtime.fleet.tokens import Token
from runtime.flow.gate import EndpointGates
from runtime.flow.limits import in_flight_key, limits_key, stats_key
from runtime.flow.waiting import WORDS, decode
from runtime.models.base import ModelError, Usage
from runtime.models.profiles import EndpointLimits
from runtime.ops.flow_metrics import counter_families


class HandedBack(Exception):
    pass


def _hand_back() -> NoReturn:
    raise HandedBack


@pytest.fixture
def client(servers: tuple[str, str]) -> Iterator[redis.Redis[bytes]]:
    c: redis.Redis[bytes] = redis.Redis.from_url(servers[1])
    yield c
    c.close()


@pytest.fixture
def gates(client: redis.Redis[bytes], namespace: str) -> Iterator[EndpointGates]:
    made = EndpointGates(client, namespace)
    yield made
    made.stop()  # its subscriber


def _lease(client: redis.Redis[bytes], namespace: str) -> RunLease:
    leases = Leases(client, namespace, ttl_ms=8_000)
    # Held by the local clock for an hour: the waits here never lose it.
    return RunLease(Token("run-1", 1, "holder"), leases, valid_until_ms=monotonic_ms() + 3_600_000)


def _wait(gates: EndpointGates, lease: RunLease, *, may_wait: bool, profile: str | None = "sim"):
    log = structlog.get_logger("test")
    return EndpointWait(gates, profile, lease, may_wait=may_wait, hand_back=_hand_back, log=log)


def test_a_brief_close_is_waited_out_in_place_with_the_lease_kept_moving(
    client: redis.Redis[bytes], namespace: str, gates: EndpointGates
) -> None:
    lease = _lease(client, namespace)
    wait = _wait(gates, lease, may_wait=True)
    wait.before_request(1)  # open: asks at once
    gates.close("sim", 0.3)
    before = lease.last_progress_ms = 0
    wait.before_request(1)
    assert gates.closed_for_ms("sim") == 0, "it returned before the endpoint opened"
    assert lease.last_progress_ms > before, "the wait showed no progress to the heartbeat"


def test_a_long_close_suspends_a_run_that_may_wait(
    client: redis.Redis[bytes], namespace: str, gates: EndpointGates
) -> None:
    lease = _lease(client, namespace)
    gates.close("sim", (WAIT_IN_PLACE_MAX_MS + 30_000) / 1000)
    with pytest.raises(Suspend) as suspended:
        _wait(gates, lease, may_wait=True).before_request(2)
    kind, profile, opens_at, reason = suspended.value.waiting_on.split(":")
    assert (kind, profile, reason) == ("model", "sim", "closed")
    assert float(opens_at) > 0


def test_a_run_that_may_not_wait_waits_in_place_and_a_warm_shutdown_hands_it_back(
    client: redis.Redis[bytes], namespace: str, gates: EndpointGates
) -> None:
    lease = _lease(client, namespace)
    gates.close("sim", 60.0)
    drain.request()
    try:
        with pytest.raises(HandedBack):
            _wait(gates, lease, may_wait=False).before_request(1)
    finally:
        drain.clear()


def test_a_429_met_without_redis_is_waited_out_by_its_own_worker(namespace: str) -> None:
    # As the engine's client: no retries of its own (runtime/services.py `redis_client`).
    dead: redis.Redis[bytes] = redis.Redis(
        host="127.0.0.1", port=1, socket_connect_timeout=0.5, retry=Retry(NoBackoff(), 0)
    )
    gates = EndpointGates(dead, namespace)
    lease = _lease(dead, namespace)
    wait = _wait(gates, lease, may_wait=True)
    try:
        wait.met_429(ModelError("429", retryable=True, retry_after_s=2.0, rate_limited=True), 1)
        lease.last_progress_ms = 0
        wait.before_request(1)
    finally:
        gates.stop()
    assert lease.last_progress_ms > 0, "the step was asked again without waiting"


def _limited(gates: EndpointGates, lease: RunLease, limits: EndpointLimits, *, may_wait: bool):
    log = structlog.get_logger("test")
    return EndpointWait(
        gates, "sim", lease, may_wait=may_wait, hand_back=_hand_back, log=log, limits=limits
    )


def test_a_profile_without_limits_costs_no_redis_call(
    client: redis.Redis[bytes], namespace: str, gates: EndpointGates
) -> None:
    wait = _limited(gates, _lease(client, namespace), EndpointLimits(), may_wait=True)
    assert wait.before_request(1, 100, 100) is None, "no limits declared: no admission asked"
    assert not client.exists(limits_key(namespace, "sim"), in_flight_key(namespace, "sim"))


def test_a_long_wait_for_capacity_suspends_a_run_that_may_wait_uncharged(
    client: redis.Redis[bytes], namespace: str, gates: EndpointGates
) -> None:
    lease = _lease(client, namespace)
    wait = _limited(gates, lease, EndpointLimits(requests_per_minute=1), may_wait=True)
    admitted = wait.before_request(1, 10, 10)
    assert admitted is not None and admitted.request_id
    wait.after_request(admitted, Usage(input_tokens=5, output_tokens=5))
    # One request a minute: the next waits ~60 s, longer than a wait in place.
    with pytest.raises(Suspend) as suspended:
        wait.before_request(2, 10, 10)
    kind, profile, opens_at, scarcest = suspended.value.waiting_on.split(":")
    assert (kind, profile, scarcest) == ("model", "sim", "requests") and float(opens_at) > 0


def test_a_short_wait_for_capacity_is_waited_in_place_with_the_lease_kept_moving(
    client: redis.Redis[bytes], namespace: str, gates: EndpointGates
) -> None:
    lease = _lease(client, namespace)
    # 120 a minute: one every 500 ms once the full bucket is spent.
    wait = _limited(gates, lease, EndpointLimits(requests_per_minute=120), may_wait=False)
    for _ in range(120):
        assert wait.before_request(1, 1, 1) is not None
    lease.last_progress_ms = 0
    assert wait.before_request(2, 1, 1) is not None, "admitted once capacity refilled"
    assert lease.last_progress_ms > 0, "it was admitted without waiting"


Recorded = list[tuple[str, int, dict[str, Any]]]


def _recording(
    gates: EndpointGates,
    client: redis.Redis[bytes],
    namespace: str,
    recorded: Recorded,
    *,
    may_wait: bool,
    limits: EndpointLimits | None = None,
    tracing: Tracing | None = None,
) -> EndpointWait:
    return EndpointWait(
        gates,
        "sim",
        _lease(client, namespace),
        may_wait=may_wait,
        hand_back=_hand_back,
        log=structlog.get_logger("test"),
        limits=limits,
        record=lambda kind, step, detail: recorded.append((kind, step, detail)),
        tracing=tracing,
    )


def _stats(client: redis.Redis[bytes], namespace: str) -> dict[str, int]:
    raw = client.hgetall(stats_key(namespace))
    return {k.decode(): int(v) for k, v in raw.items()}


def test_a_wait_in_place_is_one_event_and_one_count_whatever_it_waits_through(
    client: redis.Redis[bytes], namespace: str, gates: EndpointGates
) -> None:
    recorded: Recorded = []
    # 120 a minute: once the bucket is spent, one every 500 ms.
    limits = EndpointLimits(requests_per_minute=120)
    wait = _recording(gates, client, namespace, recorded, may_wait=False, limits=limits)
    for _ in range(120):
        assert wait.before_request(1, 1, 1) is not None
    assert recorded == [], "no wait, no event"
    # Closed for three slices, then at the limit: one wait, through both.
    gates.close("sim", 3 * SLICE_MS / 1000)
    started = monotonic_ms()
    assert wait.before_request(2, 1, 1) is not None
    assert monotonic_ms() - started >= 3 * SLICE_MS, "it did not wait out the close"
    assert [(kind, step) for kind, step, _ in recorded] == [(WAIT_EVENT, 2)]
    details = recorded[0][2]
    assert set(details) == set(WORDS)
    assert details["endpoint"] == "sim" and details["reason"] == "closed"
    assert details["in_place"] is True and 0 < details["wait_ms"] <= 3 * SLICE_MS
    stats = _stats(client, namespace)
    assert stats.get("waits_in_place:sim:other") == 1, stats
    assert stats.get("admitted:sim:other") == 121, stats
    assert "waits_suspended:sim:other" not in stats


def test_a_limits_wait_in_place_is_counted_by_the_admit_script(
    client: redis.Redis[bytes], namespace: str, gates: EndpointGates
) -> None:
    recorded: Recorded = []
    wait = _recording(
        gates,
        client,
        namespace,
        recorded,
        may_wait=False,
        limits=EndpointLimits(requests_per_minute=120),
    )
    for _ in range(120):
        wait.before_request(1, 1, 1)
    wait.before_request(2, 1, 1)
    ((kind, step, details),) = recorded
    assert (kind, step, details["reason"], details["limit"]) == (
        WAIT_EVENT,
        2,
        "limited",
        "requests",
    )
    assert _stats(client, namespace).get("waits_in_place:sim:other") == 1


@pytest.mark.parametrize("how", ["closed", "limited"])
def test_a_suspension_says_what_a_wait_in_place_says(
    client: redis.Redis[bytes], namespace: str, gates: EndpointGates, how: str
) -> None:
    recorded: Recorded = []
    limits = EndpointLimits(requests_per_minute=1) if how == "limited" else None
    wait = _recording(gates, client, namespace, recorded, may_wait=True, limits=limits)
    if how == "limited":
        assert wait.before_request(1, 1, 1) is not None  # the minute's one request
    else:
        gates.close("sim", (WAIT_IN_PLACE_MAX_MS + 30_000) / 1000)
    with pytest.raises(Suspend) as suspended:
        wait.before_request(2, 1, 1)
    detail = suspended.value.detail
    assert recorded == [], "a suspension's event is the suspension's own"
    assert set(detail) == set(WORDS) and detail["in_place"] is False
    assert detail["endpoint"] == "sim" and detail["reason"] == how
    assert detail["limit"] == ("requests" if how == "limited" else None)
    assert detail["wait_ms"] > WAIT_IN_PLACE_MAX_MS
    # What inspect decodes from waiting_on says the same.
    decoded = decode(suspended.value.waiting_on)
    assert decoded is not None
    assert decoded.view() == {k: detail[k] for k in ("endpoint", "reason", "limit", "until")}
    stats = _stats(client, namespace)
    assert stats.get("waits_suspended:sim:other") == 1, stats
    assert "waits_in_place:sim:other" not in stats


def test_a_429_is_an_event_counted_by_the_close_script(
    client: redis.Redis[bytes], namespace: str, gates: EndpointGates
) -> None:
    recorded: Recorded = []
    wait = _recording(gates, client, namespace, recorded, may_wait=True)
    wait.met_429(ModelError("429", retryable=True, retry_after_s=2.0, rate_limited=True), 3)
    assert recorded == [
        (RATE_LIMITED_EVENT, 3, {"endpoint": "sim", "retry_after_s": 2.0, "closed_ms": 2000})
    ]
    assert _stats(client, namespace).get("rate_limited:sim:other") == 1


def test_a_wait_and_a_429_are_events_on_the_steps_span(
    client: redis.Redis[bytes], namespace: str, gates: EndpointGates
) -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing = Tracing(provider)
    recorded: Recorded = []
    wait = _recording(gates, client, namespace, recorded, may_wait=True, tracing=tracing)
    with tracing.step(1), tracing.model_request(1):
        wait.met_429(ModelError("429", retryable=True, retry_after_s=0.3, rate_limited=True), 1)
        wait.before_request(1)
    provider.shutdown()
    (request,) = [s for s in exporter.get_finished_spans() if s.name == "liyagent.model_request"]
    events = {e.name: dict(e.attributes or {}) for e in request.events}
    assert set(events) == {"liyagent.rate_limited", "liyagent.endpoint_wait"}
    waited = events["liyagent.endpoint_wait"]
    assert waited["liyagent.endpoint"] == "sim" and waited["liyagent.reason"] == "closed"
    assert 0 < int(waited["liyagent.wait_ms"]) <= 300 and waited["liyagent.in_place"] is True
    assert events["liyagent.rate_limited"]["liyagent.retry_after_s"] == 0.3
    # Only the flow's own words: never a key, a header, a message.
    for attrs in events.values():
        assert {k.removeprefix("liyagent.") for k in attrs} <= {
            *WORDS,
            "retry_after_s",
            "closed_ms",
        }


def test_waiting_on_decodes_old_new_and_other_waits() -> None:
    new = decode("model:sim:1700000000.500:in_flight")
    assert new is not None
    assert (new.endpoint, new.reason, new.limit) == ("sim", "limited", "in_flight")
    assert new.until == 1700000000.5
    old = decode("model:sim:1700000000.500")  # written before the reason was added
    assert old is not None and (old.endpoint, old.reason) == ("sim", "unknown")
    colon = decode("model:team:gpt:1700000000:closed")
    assert colon is not None and (colon.endpoint, colon.reason) == ("team:gpt", "closed")
    assert decode("approval:abc") is None and decode(None) is None
    assert decode("model:sim:soon") is None
    assert "sim" in new.said() and "in_flight" in new.said()


def test_the_counters_name_the_runs_tenant_label(
    client: redis.Redis[bytes], namespace: str, gates: EndpointGates
) -> None:
    """Admissions, waits and 429s are counted per endpoint and tenant (the label the run's
    deployment gives it); the metrics read them so, and a field of an earlier version (no
    tenant) as `other`."""
    wait = EndpointWait(
        gates,
        "sim",
        _lease(client, namespace),
        may_wait=False,
        hand_back=_hand_back,
        log=structlog.get_logger("test"),
        limits=EndpointLimits(requests_per_minute=120),
        tenant="acme",
    )
    for _ in range(3):
        wait.before_request(1, 1, 1)
    wait.met_429(ModelError("429", retryable=True, retry_after_s=0.1, rate_limited=True), 1)
    stats = _stats(client, namespace)
    assert stats.get("admitted:sim:acme") == 3, stats
    assert stats.get("rate_limited:sim:acme") == 1, stats
    client.hincrby(stats_key(namespace), "admitted:sim", 2)  # written by an earlier version
    families = {
        f.name: {tuple(sorted(x.labels.items())): x.value for x in f.samples}
        for f in counter_families(client.hgetall(stats_key(namespace)))
    }
    admitted = families["liyagent_model_requests_admitted"]
    assert admitted[(("endpoint", "sim"), ("tenant", "acme"))] == 3
    assert admitted[(("endpoint", "sim"), ("tenant", "other"))] == 2
    limited = families["liyagent_model_rate_limited"]
    assert limited == {(("endpoint", "sim"), ("tenant", "acme")): 1}
