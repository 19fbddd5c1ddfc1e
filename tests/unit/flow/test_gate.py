"""The endpoint gate's scripts decide on a real Redis: open until a 429 closes it; a close is
never shortened by a shorter one; without a Retry-After the backoff doubles up to its cap; a
Retry-After above the longest close is cut to it; the keys carry a TTL; and a Redis out of
reach admits (fail open) while a 429 is still waited out by its own process. How a close
reaches the other processes (pushed, no round trip per check) is tests/unit/flow/test_closes.py."""

from __future__ import annotations

import re
from collections.abc import Iterator
from importlib.resources import files

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from runtime.flow.gate import NAMES, EndpointGates, backoffs_key, closed_key

LUA = files("runtime.flow") / "lua"


@pytest.fixture
def gates(servers: tuple[str, str], namespace: str) -> Iterator[EndpointGates]:
    client = redis.Redis.from_url(servers[1])
    gates = EndpointGates(client, namespace)
    yield gates
    gates.stop()
    client.close()


def test_an_endpoint_is_open_until_a_429_closes_it_for_its_retry_after(
    gates: EndpointGates,
) -> None:
    assert gates.closed_for_ms("sim") == 0
    closed = gates.close("sim", 5.0)
    assert 4_000 < closed <= 5_000
    assert 4_000 < gates.closed_for_ms("sim") <= closed
    assert gates.closed_for_ms("other") == 0, "a close is per endpoint (model profile)"


def test_a_shorter_close_never_shortens_a_longer_one_and_a_longer_one_extends_it(
    gates: EndpointGates,
) -> None:
    gates.close("sim", 30.0)
    assert gates.close("sim", 1.0) > 20_000
    assert gates.closed_for_ms("sim") > 20_000
    assert gates.close("sim", 60.0) > 50_000


def test_without_a_retry_after_the_backoff_doubles_up_to_its_cap(gates: EndpointGates) -> None:
    gates.backoff_ms, gates.backoff_max_ms = 10_000, 40_000
    closes = [gates.close("sim", None) for _ in range(4)]
    # Each close is the longer of the one set and the next backoff: 10 s, 20, 40, 40 (cap).
    assert 9_000 < closes[0] <= 10_000
    assert 19_000 < closes[1] <= 20_000
    assert 39_000 < closes[2] <= 40_000
    assert 39_000 < closes[3] <= 40_000


def test_a_retry_after_above_the_longest_close_is_cut_to_it(gates: EndpointGates) -> None:
    gates.close_max_ms = 2_000
    assert 0 < gates.close("sim", 3_600.0) <= 2_000


def test_the_gate_keys_are_bounded_by_a_ttl(gates: EndpointGates, namespace: str) -> None:
    gates.close("sim", None)
    gates.close("sim", 5.0)
    for key in (closed_key(namespace), backoffs_key(namespace)):
        ttl = gates.client.pttl(key)
        assert 5_000 < ttl <= 5_000 + gates.backoff_max_ms, key


def test_a_backoff_count_is_forgotten_once_the_endpoint_was_open_the_longest_backoff(
    gates: EndpointGates,
) -> None:
    gates.backoff_ms, gates.backoff_max_ms = 1_000, 4_000
    assert 0 < gates.close("sim", None) <= 1_000
    assert 1_000 < gates.close("sim", None) <= 2_000, "a second 429 in a row doubles the backoff"
    gates.client.hset(closed_key(gates.namespace), "sim", 0)  # open since long ago (epoch 0)
    assert 0 < gates.close("sim", None) <= 1_000, "after a quiet spell the backoff starts over"


def test_redis_out_of_reach_admits_and_a_429_is_waited_out_alone(namespace: str) -> None:
    # As the engine's client: no retries of its own (runtime/services.py `redis_client`).
    dead: redis.Redis[bytes] = redis.Redis(
        host="127.0.0.1", port=1, socket_connect_timeout=0.5, retry=Retry(NoBackoff(), 0)
    )
    gates = EndpointGates(dead, namespace)
    try:
        assert gates.closed_for_ms("sim") == 0, "the gate fails open"
        assert gates.close("sim", 3.0) == 3_000, "the process that met the 429 still waits it out"
        assert gates.closed_for_ms("sim") > 2_000, "and knows it at once, without Redis"
        assert gates.close("sim", None) == gates.backoff_ms
    finally:
        gates.stop()


@pytest.mark.parametrize("name", NAMES)
def test_every_key_and_argument_a_gate_script_uses_is_in_its_header(name: str) -> None:
    lines = (LUA / f"{name}.lua").read_text().splitlines()
    header = "\n".join(line for line in lines if line.startswith("--"))
    body = "\n".join(line for line in lines if not line.startswith("--"))
    for kind, n in sorted(set(re.findall(r"\b(KEYS|ARGV)\[(\d+)\]", body))):
        assert f"{kind}[{n}]" in header, f"lua/{name}.lua uses {kind}[{n}] unnamed in its header"
