"""Tenants: a new run past its tenant's bound on runs in flight is held (stored, waiting on
`tenant`, not published), other tenants' runs are not; held runs are admitted as room frees,
highest priority first, never past the bound, under concurrent starts too; bad input at the
door stores nothing."""

from __future__ import annotations

import itertools
import re
import threading
from typing import Any

import pytest

from runtime.base.refused import BadRequest
from runtime.base.tenancy import HIGH, LOW, NORMAL, TenantLimits
from runtime.entries.client import Client
from runtime.flow import tenants
from tests.integration.cli.test_cli import cli
from tests.support.scripts import final
from tests.support.stack import RecordingPublisher, Stack, services_with


def _quiet(stack: Stack, in_flight: int, **weights: float) -> tuple[Client, RecordingPublisher]:
    """A client over the stack's stores with tenants bounded, publishing nowhere."""
    stack.reconfigure(tenants=TenantLimits(in_flight, tuple(sorted(weights.items()))))
    publisher = RecordingPublisher()
    return Client(services_with(stack, publisher)), publisher


def _start(stack: Stack, client: Client, owner: str, **more: Any) -> str:
    """A run of `owner` (its tenant unless `tenant=` names another)."""
    return client.start_run(
        agent="support-bot",
        model=stack.model([final("ok")]),
        user_input="x",
        owner=owner,
        **more,
    )


def _status(stack: Stack, run_id: str) -> tuple[str, str | None]:
    row = stack.rows("SELECT status, waiting_on FROM runs WHERE id = :r", r=run_id)[0]
    return row.status, row.waiting_on


def _end(stack: Stack, run_id: str) -> None:
    """The run ends (as its worker's statement would leave it)."""
    with stack.engine.begin() as conn:
        conn.exec_driver_sql(
            "UPDATE runs SET status = 'succeeded', finished_at = now() WHERE id = %s", (run_id,)
        )


def test_a_tenant_past_its_bound_is_held_and_another_tenant_is_not(stack) -> None:
    client, published = _quiet(stack, 2)
    big = [_start(stack, client, "big") for _ in range(3)]
    small = _start(stack, client, "small")
    assert [_status(stack, r) for r in big] == [("queued", None)] * 2 + [("waiting", "tenant")]
    assert _status(stack, small) == ("queued", None)
    # Held: stored with its first checkpoint, never published; its events say what for.
    assert published.sent == [(big[0], 1), (big[1], 1), (small, 1)]
    waiting = [e for e in client.events(big[2]).events if e.kind == "waiting"]
    assert [e.details for e in waiting] == [{"waiting_on": "tenant"}]
    view = client.get(big[2])
    assert (view.tenant, view.priority) == ("big", NORMAL)
    assert view.waiting_for == {"reason": "tenant", "tenant": "big"}
    said = cli("inspect", big[2], env=stack.env).stdout
    assert "Waiting for: its tenant big's turn" in said
    tenant_of = stack.rows("SELECT tenant FROM runs WHERE id = :r", r=small)[0].tenant
    assert tenant_of == "small"  # its owner, as none was named


def test_held_runs_are_admitted_in_priority_order_as_room_frees(stack) -> None:
    client, _ = _quiet(stack, 1)
    first = _start(stack, client, "t")
    low = _start(stack, client, "t", priority=LOW)
    normal = _start(stack, client, "t")
    high = _start(stack, client, "t", priority=HIGH)
    limits = stack.settings.tenants
    # No room while the first runs: nothing admitted.
    assert tenants.admit(stack.engine, limits, "t") == []
    order = []
    for ending in (first, high, normal):
        _end(stack, ending)
        admitted = tenants.admit(stack.engine, limits, "t")
        assert len(admitted) == 1 and admitted[0].attempt == 1
        order.append((admitted[0].run_id, admitted[0].priority))
    assert order == [(high, HIGH), (normal, NORMAL), (low, LOW)]
    audit = stack.rows(
        "SELECT detail FROM audit_events WHERE run_id = :r AND kind = 'agent.run.admitted'",
        r=high,
    )
    assert [a.detail for a in audit] == [{"tenant": "t", "limit": 1}]


def test_a_new_run_never_passes_held_ones_when_room_frees(stack) -> None:
    client, published = _quiet(stack, 1)
    first = _start(stack, client, "t")
    high = _start(stack, client, "t", priority=HIGH)
    _end(stack, first)  # room, before any worker admitted the held run
    late = _start(stack, client, "t", priority=LOW)
    assert _status(stack, high) == ("queued", None)
    assert _status(stack, late) == ("waiting", "tenant")
    assert published.sent == [(first, 1), (high, 1)]


def test_a_weight_scales_a_tenants_bound_and_a_named_tenant_is_counted_as_itself(stack) -> None:
    client, _ = _quiet(stack, 2, gold=2.0)
    gold = [_start(stack, client, f"user-{i}", tenant="gold") for i in range(5)]
    assert [_status(stack, r)[0] for r in gold] == ["queued"] * 4 + ["waiting"]


def test_concurrent_starts_of_one_tenant_never_pass_its_bound(stack) -> None:
    client, _ = _quiet(stack, 3)
    barrier = threading.Barrier(12)
    errors: list[BaseException] = []

    def start() -> None:
        try:
            barrier.wait()
            _start(stack, client, "rush")
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=start) for _ in range(12)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    counts = stack.rows(
        "SELECT status, count(*) AS n FROM runs WHERE tenant = 'rush' GROUP BY status"
    )
    assert {c.status: c.n for c in counts} == {"queued": 3, "waiting": 9}


def test_the_sweep_admits_what_no_worker_did(stack) -> None:
    client, _ = _quiet(stack, 1)
    first, held = _start(stack, client, "t"), _start(stack, client, "t")
    _end(stack, first)  # ended with no worker to admit (an operator's Stop, say)
    assert [a.run_id for a in tenants.admit_every(stack.engine, stack.settings.tenants)] == [held]
    assert _status(stack, held) == ("queued", None)


@pytest.mark.parametrize(
    ("field", "value", "says"),
    [
        ("priority", 0, "priority 0 must be 1 (low), 2 (normal) or 3 (high)"),
        ("priority", 9, "priority 9 must be"),
        ("priority", "high", "priority"),
        ("tenant", "", "tenant must be 1-200 characters"),
        ("tenant", "x" * 201, "tenant must be 1-200 characters"),
    ],
)
def test_a_bad_priority_or_tenant_is_refused_and_stores_nothing(
    stack, field: str, value: Any, says: str
) -> None:
    client, published = _quiet(stack, 2)
    before = stack.rows("SELECT count(*) AS n FROM runs")[0].n
    with pytest.raises(BadRequest, match=re.escape(says)) as refused:
        _start(stack, client, "t", **{field: value})
    assert "nothing was stored" in str(refused.value)
    assert stack.rows("SELECT count(*) AS n FROM runs")[0].n == before
    assert published.sent == []


def test_a_worker_admits_its_tenants_next_run_when_one_ends(stack) -> None:
    """Real workers, no sweeps (only an ending run's worker admits): a tenant bounded to one
    run in flight has its runs served one after the other while another tenant's run is served
    beside them; every run succeeds."""
    stack.reconfigure(tenants=TenantLimits(1))
    stack.worker("w1", concurrency=3, sweeps=False, ops=False)
    steps = [final("slow", latency_ms=800)]
    flood = [
        stack.client.start_run(
            agent="support-bot", model=stack.model(steps), user_input="x", owner="flood"
        )
        for _ in range(3)
    ]
    quiet = stack.client.start_run(
        agent="support-bot", model=stack.model(steps), user_input="x", owner="quiet"
    )
    for run_id in [*flood, quiet]:
        assert stack.wait(run_id, timeout=60).status == "succeeded"
    times = {
        str(r.id): (r.started_at, r.finished_at)
        for r in stack.rows(
            "SELECT id, started_at, finished_at FROM runs WHERE id = ANY(CAST(:ids AS uuid[]))",
            ids=[*flood, quiet],
        )
    }
    served = sorted(times[r] for r in flood)
    # One at a time: each started after the one before it ended.
    assert all(nxt[0] >= prev[1] for prev, nxt in itertools.pairwise(served))
    # The quiet tenant's run was not held behind the flood: it ran beside the first.
    assert times[quiet][0] < served[0][1]
    admitted = stack.rows(
        "SELECT count(*) AS n FROM audit_events WHERE kind = 'agent.run.admitted' "
        "AND run_id = ANY(CAST(:ids AS uuid[]))",
        ids=flood,
    )[0].n
    assert admitted == 2


def test_lifting_the_bound_releases_every_held_run(stack) -> None:
    """A deployment that unsets LIYAGENT_TENANT_IN_FLIGHT (or a worker started without it)
    strands nothing: the next sweep admits every held run."""
    client, _ = _quiet(stack, 1)
    first = _start(stack, client, "t")
    held = [_start(stack, client, "t", priority=p) for p in (LOW, HIGH)]
    assert [_status(stack, r)[1] for r in held] == ["tenant", "tenant"]
    admitted = tenants.admit_every(stack.engine, TenantLimits())
    assert [a.run_id for a in admitted] == [held[1], held[0]]  # still in priority order
    assert _status(stack, first) == ("queued", None)
    assert all(_status(stack, r) == ("queued", None) for r in held)


def test_the_sweep_admits_only_tenants_with_room(stack) -> None:
    client, _ = _quiet(stack, 1)
    full = [_start(stack, client, "full") for _ in range(2)]  # one in flight, one held
    roomy = [_start(stack, client, "roomy") for _ in range(2)]
    _end(stack, roomy[0])
    admitted = tenants.admit_every(stack.engine, stack.settings.tenants)
    assert [a.run_id for a in admitted] == [roomy[1]]
    assert _status(stack, full[1]) == ("waiting", "tenant")


def test_a_run_suspended_on_its_model_endpoint_still_counts_in_flight(stack) -> None:
    """A run suspended for a model endpoint's capacity is woken with the others when it opens:
    it keeps its place under its tenant's bound, or a close would let the tenant's whole
    backlog through."""
    client, _ = _quiet(stack, 1)
    first = _start(stack, client, "t")
    with stack.engine.begin() as conn:
        conn.exec_driver_sql(
            "UPDATE runs SET status = 'waiting', waiting_on = 'model:sim:9999999999:closed' "
            "WHERE id = %s",
            (first,),
        )
    assert tenants.admit(stack.engine, stack.settings.tenants, "t") == []
    assert _status(stack, _start(stack, client, "t")) == ("waiting", "tenant")
