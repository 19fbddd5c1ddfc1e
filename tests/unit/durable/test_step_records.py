"""Step records in pure logic: a chained seal opens only after the record it was chained to,
and applying each step's delta to the base rebuilds exactly the state that wrote them."""

from __future__ import annotations

import json

import pytest

from runtime.base.sealing import SealError, digest, new_key_entry, parse_keys
from runtime.durable.state import RunState, ToolCall


@pytest.fixture
def sealer():
    return parse_keys(new_key_entry("k1"))


def test_a_chained_record_opens_only_after_its_predecessor(sealer) -> None:
    first = sealer.seal("run-a", "step", 1, {"n": 1}, chain=digest(b"base"))
    second = sealer.seal("run-a", "step", 2, {"n": 2}, chain=digest(first))
    assert sealer.open("run-a", "step", 2, second, chain=digest(first)) == {"n": 2}
    for wrong in (digest(b"base"), digest(second), None):
        with pytest.raises(SealError):
            sealer.open("run-a", "step", 2, second, chain=wrong)


def _steps(state: RunState) -> list[dict]:
    """Drive the state as the agent and workflow loops do, taking a delta per step."""
    deltas = []
    for n in range(1, 6):
        if n > 1:
            state.add_results([{"role": "tool", "tool_call_id": f"c{n - 1}", "content": "{}"}])
        state.take_step(f"step {n}", [ToolCall(f"c{n}", "ticket.read", {"n": n})], attempt=1)
        state.cursor.setdefault("loops", {})["a"] = n  # changed in place, as a workflow does
        state.delegation_keys[f"c{n}"] = (
            f"key-{n}" if n % 2 else state.delegation_keys.get("c1", "key-1")
        )
        deltas.append(json.loads(json.dumps(state.delta())))
        state.mark_written(digest(repr(deltas[-1]).encode()))
    return deltas


def test_deltas_rebuild_the_state_that_wrote_them() -> None:
    live = RunState.initial("agent", "be brief", "help")
    base = json.loads(json.dumps(live.to_payload()))  # as sealing serialises it
    live.mark_written(b"base")
    deltas = _steps(live)
    rebuilt = RunState.from_payload(base)
    for delta in deltas:
        rebuilt.apply(delta)
    assert rebuilt.to_payload() == live.to_payload()
    # Each delta holds only its step's new messages: the earlier ones are never written again.
    assert [len(d["messages"]) for d in deltas] == [1, 2, 2, 2, 2]
    assert all(set(d["counters"]) == {"model_steps"} for d in deltas)
