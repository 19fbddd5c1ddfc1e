"""A Stop cuts the request its running attempt is waiting on, within moments, not at the next
step boundary and not at its heartbeat's next renewal: the Stop drops the run's lease and says
so on `leases:dropped`, and the worker holding it cuts the socket (runtime/fleet/drops.py,
runtime/sending/in_flight.py). Heard on real Redis, cut in a real worker process, judged by
the model server's records and by the worker's one slot coming free."""

from __future__ import annotations

import pytest

from tests.support.drifts import until
from tests.support.scripts import final

# The heartbeat renews only every 20 s here, so nothing but the push can free the slot sooner.
SLOW_HEARTBEAT = {"LIYAGENT_LEASE_TTL_MS": "60000", "LIYAGENT_HEARTBEAT_MS": "20000"}


@pytest.mark.parametrize("pool", ["prefork", "threads"])
def test_a_stop_cuts_the_model_request_in_flight(stack, pool: str) -> None:
    stack.worker("w1", concurrency=1, pool=pool, env=SLOW_HEARTBEAT)
    slow = stack.client.start_run(
        agent="support-bot",
        model=stack.model([final("too late", latency_ms=25_000)]),
        user_input="a long answer",
        tools=[],
    )
    asked = (
        "SELECT count(*) AS n FROM sim.requests WHERE vendor = 'model' AND run_id = :r "
        "AND method = 'POST'"
    )
    until(lambda: stack.vendor(asked, r=slow)[0].n == 1, "the model asked, answering slowly")
    assert stack.client.stop(run_id=slow, reason="wrong customer", by="ops") == [slow]
    # The worker's one slot comes free at once: the next run is answered long before the
    # slow answer (25 s) or the heartbeat's renewal (20 s) could have freed it.
    quick = stack.client.start_run(
        agent="support-bot",
        model=stack.model([final("Next one.")]),
        user_input="quick",
        tools=[],
    )
    view = stack.wait(quick, timeout=10)
    assert view.status == "succeeded" and view.answer == "Next one."
    stopped = stack.client.get(slow)
    assert stopped.status == "failed" and "stopped by ops" in (stopped.failure_reason or "")
    assert stack.vendor(asked, r=slow)[0].n == 1  # never asked again
    # Its attempt ended as one fenced out, not as an error.
    kinds = [r.kind for r in stack.rows("SELECT kind FROM audit_events WHERE run_id = :r", r=slow)]
    assert "agent.run.error" not in kinds, kinds
