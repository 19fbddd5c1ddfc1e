"""A checkpoint or answer that fails its seal is never used: the run fails, audited (I6)."""

from __future__ import annotations

import pytest

from tests.support.scripts import mixed


def _flip_byte(stack, table: str, column: str, where: str, **params) -> None:
    stack.rows(
        f"UPDATE {table} SET {column} = set_byte({column}, 30, "
        f"get_byte({column}, 30) # 1) WHERE {where} RETURNING 1",
        **params,
    )


def _resume(stack, run_id: str):
    stack.worker("survivor")
    stack.beat()
    return stack.wait(run_id, timeout=60)


@pytest.mark.kill
def test_tampered_checkpoint_fails_the_run(stack) -> None:
    stack.worker("victim", fault="after_checkpoint:kill")
    run_id = stack.start(mixed("t"))
    stack.fault_hit("victim")
    _flip_byte(stack, "runs", "checkpoint", "id = :r AND step = 1", r=run_id)
    view = _resume(stack, run_id)
    assert view.status == "failed"
    assert "does not verify" in view.failure_reason
    audit = stack.rows(
        "SELECT detail FROM audit_events WHERE run_id = :r AND kind = 'agent.run.failed'", r=run_id
    )
    assert [a.detail["code"] for a in audit] == ["seal_failed"]
    assert stack.client.transcript(run_id)[-1][0] == "notice"
    # The tampered checkpoint was never used: none of its calls reached a vendor.
    assert stack.vendor_writes(run_id) == []


@pytest.mark.kill
def test_checkpoint_moved_from_another_run_fails(stack) -> None:
    stack.worker("victim", fault="after_checkpoint:kill")
    run_id = stack.start(mixed("m"))
    stack.fault_hit("victim")
    other = stack.start(mixed("n"))
    stack.rows(
        "UPDATE runs SET checkpoint = (SELECT checkpoint FROM runs WHERE id = :o) "
        "WHERE id = :r AND step = 1 RETURNING 1",
        o=other,
        r=run_id,
    )
    view = _resume(stack, run_id)
    assert view.status == "failed" and "does not verify" in view.failure_reason
    assert stack.vendor_writes(run_id) == []


def _refused_before_anything(stack, run_id: str, says: str) -> None:
    """The run failed as a seal failure, audited, before its model was asked or a call made."""
    stack.worker("w1")
    view = stack.wait(run_id, timeout=60)
    assert view.status == "failed", view
    assert says in (view.failure_reason or "")
    audit = stack.rows(
        "SELECT detail FROM audit_events WHERE run_id = :r AND kind = 'agent.run.failed'", r=run_id
    )
    assert [a.detail["code"] for a in audit] == ["seal_failed"]
    assert stack.asked(run_id) == {}
    assert stack.vendor_writes(run_id) == []


def test_a_tampered_definition_fails_the_run_before_its_model_is_asked(stack) -> None:
    run_id = stack.start(mixed("d"))
    _flip_byte(stack, "runs", "definition", "id = :r", r=run_id)
    _refused_before_anything(stack, run_id, "the sealed definition does not verify")


def test_a_definition_moved_from_a_run_with_more_tools_fails(stack) -> None:
    """The probe's steer: a queued run given the definition of another run, one allowed more
    tools, is refused; it never gets tools it was not given."""
    reads = [{"calls": [{"id": "toolu_x_r", "tool": "ticket.read", "args": {"ticket": "T-1"}}]}]
    run_id = stack.start([*reads, {"final": "done"}], tools=["ticket.read"])
    wider = stack.start(mixed("w"))
    stack.rows(
        "UPDATE runs SET definition = (SELECT definition FROM runs WHERE id = :o) "
        "WHERE id = :r RETURNING 1",
        o=wider,
        r=run_id,
    )
    _refused_before_anything(stack, run_id, "authentication failed")


@pytest.mark.parametrize(
    ("column", "value"),
    [("owner", "someone-else"), ("channel", "teams"), ("correlation_id", "another-run")],
)
def test_a_row_that_differs_from_its_sealed_definition_fails(stack, column, value) -> None:
    """Who a run is lives in its sealed definition; the columns that repeat it for SQL (gates,
    lists, keys) must agree, so a revoked owner cannot be renamed away under a run."""
    run_id = stack.start(mixed("o"))
    stack.rows(f"UPDATE runs SET {column} = :v WHERE id = :r RETURNING 1", v=value, r=run_id)
    _refused_before_anything(stack, run_id, f"the run's {column} differs from its sealed one")
