"""The fleet's limits on a model endpoint decide on a real Redis (`lua/admit.lua`): a request
is admitted within every limit, else told how long to wait for the scarcest of requests, input
tokens, output tokens per minute or requests in flight, nothing taken; an in-flight entry of a
worker killed mid-request expires by itself; a settlement, carried by the next request's call,
removes the request from flight and corrects its token estimate by the response's usage; the
keys carry a TTL; Redis out of reach admits (fail open)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from importlib.resources import files

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from runtime.flow.limits import (
    IN_FLIGHT_RETRY_MS,
    Limiter,
    in_flight_key,
    input_estimate,
    limits_key,
)
from runtime.models.base import Usage
from runtime.models.profiles import EndpointLimits

EXPIRY_MS = 60_000


@pytest.fixture
def limiter(servers: tuple[str, str], namespace: str) -> Iterator[Limiter]:
    client = redis.Redis.from_url(servers[1])
    limiter = Limiter(client, namespace)
    # Settlements travel with the next request only here (the flush is tested on its own below).
    limiter.flush_s = 3_600
    yield limiter
    client.close()


def test_requests_past_the_per_minute_limit_wait_for_the_next_to_refill(limiter: Limiter) -> None:
    limits = EndpointLimits(requests_per_minute=2)
    assert limiter.admit("sim", limits, 10, 10, EXPIRY_MS).wait_ms == 0
    assert limiter.admit("sim", limits, 10, 10, EXPIRY_MS).wait_ms == 0
    third = limiter.admit("sim", limits, 10, 10, EXPIRY_MS)
    # Two a minute: one more in 30 s (less what has refilled since).
    assert third.scarcest == "requests" and 29_000 < third.wait_ms <= 30_000
    assert limiter.admit("other", limits, 10, 10, EXPIRY_MS).wait_ms == 0, "per endpoint"


def test_the_wait_is_for_the_scarcest_dimension_and_nothing_is_taken(limiter: Limiter) -> None:
    limits = EndpointLimits(
        requests_per_minute=60, input_tokens_per_minute=1_000, output_tokens_per_minute=100
    )
    assert limiter.admit("sim", limits, 800, 10, EXPIRY_MS).wait_ms == 0
    short = limiter.admit("sim", limits, 800, 10, EXPIRY_MS)
    # 200 input tokens left, 800 needed and a second's refill kept in reserve (17): 617 at
    # 1,000 a minute is 37 s.
    assert short.scarcest == "input_tokens" and 36_000 < short.wait_ms <= 37_000
    outs = limiter.admit("sim", limits, 100, 100, EXPIRY_MS)
    # 90 output tokens left, 100 needed (the reserve never asks more than a whole bucket): 6 s,
    # beside the requests' second: outputs are scarcest.
    assert outs.scarcest == "output_tokens" and 5_000 < outs.wait_ms <= 6_000
    # Nothing was taken by the refusals: 200 input tokens are still there for a small request.
    assert limiter.admit("sim", limits, 150, 10, EXPIRY_MS).wait_ms == 0


def test_a_token_bucket_keeps_a_seconds_refill_in_reserve(limiter: Limiter) -> None:
    """Requests that reach the provider earlier than their admission's pace still find its
    bucket refilled: after 5,800 of a bucket of 6,000 a minute, 99 more are admitted but not
    101 (100, a second's refill, stays)."""
    limits = EndpointLimits(input_tokens_per_minute=6_000)
    assert limiter.admit("sim", limits, 5_800, 0, EXPIRY_MS).wait_ms == 0
    waits = limiter.admit("sim", limits, 101, 0, EXPIRY_MS)
    assert waits.scarcest == "input_tokens" and 0 < waits.wait_ms <= 1_000
    assert limiter.admit("sim", limits, 99, 0, EXPIRY_MS).wait_ms == 0


def test_a_request_above_a_whole_minute_waits_for_a_full_bucket_not_forever(
    limiter: Limiter,
) -> None:
    limits = EndpointLimits(input_tokens_per_minute=1_000)
    assert limiter.admit("sim", limits, 5_000, 10, EXPIRY_MS).wait_ms == 0, "a full bucket admits"
    later = limiter.admit("sim", limits, 10, 10, EXPIRY_MS)
    # The bucket is 4,000 in debt: 4,010 tokens and the reserve to refill at 1,000 a minute.
    assert later.scarcest == "input_tokens" and 241_000 < later.wait_ms <= 241_600


def test_the_in_flight_limit_admits_once_a_request_is_settled(limiter: Limiter) -> None:
    limits = EndpointLimits(in_flight=1)
    first = limiter.admit("sim", limits, 10, 10, EXPIRY_MS)
    assert first.wait_ms == 0
    full = limiter.admit("sim", limits, 10, 10, EXPIRY_MS)
    assert full.scarcest == "in_flight" and 0 < full.wait_ms <= IN_FLIGHT_RETRY_MS
    limiter.settle("sim", limits, first, None)
    # The settlement travels with the next request's own call: admitted in the same call.
    assert limiter.admit("sim", limits, 10, 10, EXPIRY_MS).wait_ms == 0


def test_a_killed_workers_in_flight_entry_expires_by_itself(
    limiter: Limiter, namespace: str
) -> None:
    limits = EndpointLimits(in_flight=1)
    lost = limiter.admit("sim", limits, 10, 10, EXPIRY_MS)
    assert limiter.admit("sim", limits, 10, 10, EXPIRY_MS).scarcest == "in_flight"
    # Its worker died mid-request, never settling it: once its expiry (the model timeout) is
    # past (set so here: scored as expired), the entry no longer counts.
    limiter.client.zadd(in_flight_key(namespace, "sim"), {lost.request_id: 1})
    assert limiter.admit("sim", limits, 10, 10, EXPIRY_MS).wait_ms == 0


def test_a_settlement_gives_back_an_overestimate_and_takes_an_excess(limiter: Limiter) -> None:
    limits = EndpointLimits(input_tokens_per_minute=1_000, output_tokens_per_minute=1_000)
    big = limiter.admit("sim", limits, 800, 500, EXPIRY_MS)
    assert limiter.admit("sim", limits, 800, 10, EXPIRY_MS).scarcest == "input_tokens"
    # It used 100 input tokens, not 800: 700 given back, so 800 fit again.
    limiter.settle("sim", limits, big, Usage(input_tokens=100, output_tokens=500))
    small = limiter.admit("sim", limits, 800, 10, EXPIRY_MS)
    assert small.wait_ms == 0
    # It used 480 output tokens, not 10: the excess taken, so 500 more must wait.
    limiter.settle("sim", limits, small, Usage(input_tokens=800, output_tokens=480))
    assert limiter.admit("sim", limits, 10, 500, EXPIRY_MS).scarcest == "output_tokens"


def test_settlements_without_a_next_request_are_flushed(limiter: Limiter) -> None:
    limits = EndpointLimits(in_flight=1)
    first = limiter.admit("sim", limits, 10, 10, EXPIRY_MS)
    limiter.settle("sim", limits, first, None)
    limiter.flush()  # what the timer does when no request carries them
    assert limiter.client.zcard(in_flight_key(limiter.namespace, "sim")) == 0
    assert limiter.admit("sim", limits, 10, 10, EXPIRY_MS).wait_ms == 0


def test_the_limit_keys_are_bounded_by_a_ttl(limiter: Limiter, namespace: str) -> None:
    limiter.admit("sim", EndpointLimits(requests_per_minute=5, in_flight=2), 1, 1, EXPIRY_MS)
    for key in (limits_key(namespace, "sim"), in_flight_key(namespace, "sim")):
        assert limiter.client.pttl(key) > 0, key


def test_redis_out_of_reach_admits(namespace: str) -> None:
    dead: redis.Redis[bytes] = redis.Redis(
        host="127.0.0.1", port=1, socket_connect_timeout=0.5, retry=Retry(NoBackoff(), 0)
    )
    limiter = Limiter(dead, namespace)
    admitted = limiter.admit("sim", EndpointLimits(requests_per_minute=1), 1, 1, EXPIRY_MS)
    assert admitted.wait_ms == 0
    limiter.settle("sim", EndpointLimits(requests_per_minute=1), admitted, None)  # nothing kept
    limiter.flush()


def test_no_limits_declared_means_no_limiter_and_the_input_estimate_is_bytes_over_four() -> None:
    assert not EndpointLimits().declared()
    assert EndpointLimits(in_flight=3).declared()
    messages = [{"role": "user", "content": "x" * 400}]
    assert (
        input_estimate(messages) == len('[{"role": "user", "content": "' + "x" * 400 + '"}]') // 4
    )


def test_every_key_and_argument_the_admit_script_uses_is_in_its_header() -> None:
    lines = (files("runtime.flow") / "lua" / "admit.lua").read_text().splitlines()
    header = "\n".join(line for line in lines if line.startswith("--"))
    body = "\n".join(line for line in lines if not line.startswith("--"))
    for kind, n in sorted(set(re.findall(r"\b(KEYS|ARGV)\[(\d+)\]", body))):
        assert f"{kind}[{n}]" in header, f"lua/admit.lua uses {kind}[{n}] unnamed in its header"
