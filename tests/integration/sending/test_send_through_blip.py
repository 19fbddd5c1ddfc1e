"""A request that meets a store blip waits for the lease, unsent, and leaves once the heartbeat
has confirmed it again (a live attempt is not stopped, so its run is never charged a loss for a
Redis failover); if the run was claimed meanwhile, it is refused (I3). Real Redis behind a
cuttable proxy, this process's real presence and heartbeat, the run's row in Postgres."""

from __future__ import annotations

import threading
import time
from dataclasses import replace

from runtime import services as runtime_services
from runtime.entries.client import Client
from runtime.fleet.leases import Token, monotonic_ms
from runtime.sending import http
from runtime.sending.http import SendRefused
from store.losses import claim_lost
from store.runs import claim_delivery
from tests.support.proxy import CuttableProxy
from tests.support.scripts import final
from tests.support.stack import RecordingPublisher

# How long the cut lasts once a request waits on it: well within the blip wait (the lease
# TTL plus the store grace) and longer than the death grace that stopped its send time.
CUT_S = 1.0


def _held_then_cut(stack):
    """A run claimed by this process, its lease held by its heartbeat through a proxy to
    Redis that is then cut: returns the services, the lease, the run id and the proxy's
    address, once the lease has no send time left (the death grace from the loss ran out)."""
    host, port = stack.redis_address()
    proxy = CuttableProxy(host, port)
    settings = replace(stack.settings, redis_url=f"redis://127.0.0.1:{proxy.port}/0")
    services = runtime_services.build(settings, RecordingPublisher(), sealer=stack.sealer)
    services.heartbeat.reach = None  # no Postgres probe here: Redis alone is cut
    run_id = Client(services).start_run(
        agent="bot", model={"script": {"steps": [final()]}}, user_input="x"
    )
    token = Token(run_id, 1, services.holder)
    started = monotonic_ms()
    assert services.leases.acquire(token)
    with stack.db() as conn:
        assert claim_delivery(conn, run_id, 1, services.holder) is not None
    lease = services.heartbeat.hold(token, started)
    deadline = time.monotonic() + 10
    while lease.confirmed_ms == started and time.monotonic() < deadline:
        time.sleep(0.05)  # the presence is up and the heartbeat confirms the lease
    proxy.cut()
    while lease.send_time_left_s() > 0:
        assert time.monotonic() < deadline, "the cut did not stop the lease's send time"
        time.sleep(0.02)
    return services, lease, run_id, (host, port, proxy.port)


def _close(services) -> None:
    services.heartbeat.stop()
    services.presence.stop()
    services.engine.dispose()
    services.redis.close()


def _send_in_thread(lease) -> tuple[threading.Thread, dict[str, object]]:
    """`check_send` under the lease, as every request's bytes do before they leave."""
    result: dict[str, object] = {}

    def send() -> None:
        with http.guarded(lease):
            try:
                http.check_send()
                result["left"] = time.monotonic()
            except SendRefused as exc:
                result["refused"] = exc

    thread = threading.Thread(target=send, daemon=True)
    thread.start()
    return thread, result


def test_a_request_meeting_a_redis_blip_waits_and_leaves_once_the_lease_is_confirmed(
    stack,
) -> None:
    services, lease, _, (host, port, proxy_port) = _held_then_cut(stack)
    try:
        thread, result = _send_in_thread(lease)
        thread.join(CUT_S)
        assert thread.is_alive() and result == {}, "the request left, or was refused, unconfirmed"
        restored_at = time.monotonic()
        restored = CuttableProxy(host, port, port=proxy_port)
        thread.join(20)
        assert "refused" not in result, result.get("refused")
        assert isinstance(result.get("left"), float) and result["left"] >= restored_at
        assert lease.lost_why is None and lease.send_time_left_s() > 0
        restored.cut()
    finally:
        _close(services)


def test_a_request_meeting_a_redis_blip_is_refused_when_the_run_was_claimed_meanwhile(
    stack,
) -> None:
    services, lease, run_id, (host, port, proxy_port) = _held_then_cut(stack)
    try:
        thread, result = _send_in_thread(lease)
        # Claimed elsewhere while this process could not reach Redis: the next attempt holds
        # the lease key now.
        with stack.engine.begin() as conn:
            assert claim_lost(conn, run_id, 1, loss_limit=3) is not None
        stack.services.redis.set(
            stack.services.leases.key(run_id), str(Token(run_id, 2, "other-worker")), px=30_000
        )
        restored = CuttableProxy(host, port, port=proxy_port)
        thread.join(20)
        assert isinstance(result.get("refused"), SendRefused), result
        assert "claimed" in str(result["refused"])
        restored.cut()
    finally:
        _close(services)
