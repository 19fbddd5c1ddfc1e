"""Step keys are pure functions of the step's identity (I8)."""

from __future__ import annotations

import pytest

from runtime.durable.keys import agent_call_key, fresh_key, is_positional


def test_same_inputs_same_key() -> None:
    a = agent_call_key("corr-1", "support-bot", 3, "toolu_01A9")
    b = agent_call_key("corr-1", "support-bot", 3, "toolu_01A9")
    assert a is not None and a == b


@pytest.mark.parametrize(
    "change",
    [
        ("corr-2", "support-bot", 3, "toolu_01A9"),
        ("corr-1", "triage-bot", 3, "toolu_01A9"),
        ("corr-1", "support-bot", 4, "toolu_01A9"),
        ("corr-1", "support-bot", 3, "toolu_01A8"),
    ],
)
def test_each_part_changes_the_key(change: tuple[str, str, int, str]) -> None:
    assert agent_call_key(*change) != agent_call_key("corr-1", "support-bot", 3, "toolu_01A9")


@pytest.mark.parametrize("call_id", ["call_0", "call_12", "0", "7", "tool_3", "CALL_1", "fc-2"])
def test_positional_ids_yield_no_key(call_id: str) -> None:
    assert is_positional(call_id)
    assert agent_call_key("corr-1", "support-bot", 1, call_id) is None


@pytest.mark.parametrize("call_id", ["toolu_01A9xYz", "call_abc123DEF", "fc_67f0e1"])
def test_provider_ids_are_identities(call_id: str) -> None:
    assert not is_positional(call_id)
    assert agent_call_key("corr-1", "support-bot", 1, call_id) is not None


def test_key_ignores_clock_and_chance() -> None:
    keys = {agent_call_key("corr-1", "bot", 2, "toolu_x") for _ in range(50)}
    assert len(keys) == 1


def test_fresh_keys_differ_per_call() -> None:
    assert fresh_key() != fresh_key()


def test_workflow_keys_repeat_on_retry_and_change_on_loop_back() -> None:
    from runtime.durable.keys import workflow_step_key

    retry = workflow_step_key("wf-1", "open", 2), workflow_step_key("wf-1", "open", 2)
    assert retry[0] == retry[1]
    assert workflow_step_key("wf-1", "open", 5) != retry[0]
    assert workflow_step_key("wf-1", "note", 2) != retry[0]
    assert workflow_step_key("wf-2", "open", 2) != retry[0]
