"""A close reaches every process by push, on a real Redis: set by one EndpointGates, it is in
another's local map without that one sending Redis anything (its client's commands counted);
a subscriber that starts after a close reads it when it subscribes; the subscriber's connection
is never counted as its holder's life by the death watch; and a forked child drops its parent's
subscriber and map and starts its own, which reads the closes in force anew."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis

from runtime.fleet.leases import Leases
from runtime.flow.closes import listener_name
from runtime.flow.gate import EndpointGates


class Counting(redis.Redis):  # type: ignore[type-arg]
    """A client that counts the commands it sends (a script call is one)."""

    sent = 0

    def execute_command(self, *args: Any, **options: Any) -> Any:
        self.sent += 1
        return super().execute_command(*args, **options)


@pytest.fixture
def made(servers: tuple[str, str], namespace: str) -> Iterator[Callable[..., EndpointGates]]:
    """EndpointGates of the test's namespace, each over clients of its own (as processes)."""
    built: list[tuple[EndpointGates, list[redis.Redis[bytes]]]] = []

    def make(listener_name: str | None = None) -> EndpointGates:
        client: redis.Redis[bytes] = Counting.from_url(servers[1])
        listener: redis.Redis[bytes] = Counting.from_url(servers[1], client_name=listener_name)
        gates = EndpointGates(client, namespace, listener=listener)
        built.append((gates, [client, listener]))
        return gates

    yield make
    for gates, clients in built:
        gates.stop()
        for c in clients:
            c.close()


def _until(check: Callable[[], bool], what: str, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, what
        time.sleep(0.01)


def test_a_close_set_by_one_process_reaches_anothers_map_with_no_command_of_its_own(
    made: Callable[..., EndpointGates],
) -> None:
    here, there = made(), made()
    assert there.closed_for_ms("sim") == 0  # starts its subscriber: one read of the closes

    def sent() -> int:  # every command `there` sends but its subscription's own
        clients = (there.client, there.listener)
        return sum(c.sent for c in clients if isinstance(c, Counting))

    before = sent()
    assert before == 1, "the subscriber read the closes in force once, as it subscribed"
    here.close("sim", 30.0)
    _until(lambda: there.closed_for_ms("sim") > 0, "the close never reached the other process")
    assert there.closed_for_ms("sim") > 20_000
    assert there.closed_for_ms("other") == 0, "a close is per endpoint (model profile)"
    assert sent() == before, "checking the gate sent Redis a command"


def test_a_subscriber_that_starts_after_a_close_still_sees_it(
    made: Callable[..., EndpointGates],
) -> None:
    made().close("sim", 30.0)
    late = made()
    assert late.closed_for_ms("sim") > 20_000, "its first check did not see the close in force"


def test_the_subscribers_connection_is_not_its_holders_life(
    made: Callable[..., EndpointGates], servers: tuple[str, str], namespace: str
) -> None:
    holder = f"flowtest-{os.getpid()}-{time.monotonic_ns()}"
    gates = made(listener_name(holder))
    gates.closed_for_ms("sim")
    client: redis.Redis[bytes] = redis.Redis.from_url(servers[1])
    try:
        names = {str(c.get("name")) for c in client.client_list(_type="pubsub")}
        assert listener_name(holder) in names, "the subscriber's connection carries its name"
        assert holder not in Leases(client, namespace, 8_000).connected_holders()
    finally:
        client.close()


@pytest.mark.filterwarnings("ignore:This process .* is multi-threaded:DeprecationWarning")
def test_a_forked_child_drops_its_parents_subscriber_and_starts_its_own(
    made: Callable[..., EndpointGates],
) -> None:
    gates = made()
    assert gates.closed_for_ms("sim") == 0  # the parent's subscriber is running
    made().close("sim", 30.0)
    _until(lambda: gates.closed_for_ms("sim") > 0, "the close never reached the parent")
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: say what it sees, then leave at once
        closes = gates.closes
        dropped = (closes._thread is None, closes.left_ms("sim") == 0)
        os.write(write, repr((*dropped, gates.closed_for_ms("sim") > 20_000)).encode())
        os._exit(0)
    os.close(write)
    os.waitpid(pid, 0)
    assert os.read(read, 1000).decode() == "(True, True, True)", (
        "the child kept its parent's subscriber or map, or its own did not read the close"
    )
    assert gates.closed_for_ms("sim") > 20_000, "the parent's map is untouched"
