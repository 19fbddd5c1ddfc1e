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
