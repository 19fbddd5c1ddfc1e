"""The Pydantic AI example (examples/pydantic_desk): a team's plain `pydantic_ai.Agent`, its model
served by the simulators' OpenAI-compatible endpoint through the framework's own OpenAI client,
brought to liyagent by one module of kind declarations and started by name. A worker SIGKILLed
with a write in flight: the desk's records show no duplicate, the model server's records show no
step asked twice, and the resumed run ends with the right typed answer (the flows in
tests/support/framework_apps.py)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import framework_apps as apps
from tests.support.order_desk import Desk

APP = apps.PYDANTIC_DESK


@pytest.fixture
def desk(tmp_path: Path) -> Iterator[Desk]:
    yield from APP.desk(tmp_path)


def test_the_pydantic_ai_agent_runs_on_a_real_worker(stack, desk) -> None:
    run_id = apps.runs_through(APP, stack, desk)
    # The answer that did not fit was told to the model as a retry of its output tool.
    told = stack.told_by_tool(run_id, 5)
    assert "refunded_cents" in json.dumps(told["final_result"])


@pytest.mark.kill
@pytest.mark.parametrize(("fault", "expected"), apps.WRITES_IN_FLIGHT)
def test_a_worker_killed_with_a_write_in_flight_resumes_without_a_duplicate(
    stack, desk, fault, expected
) -> None:
    apps.resumes_a_write_in_flight(APP, stack, desk, fault, expected)


@pytest.mark.kill
def test_a_lost_attempts_billed_step_is_covered_by_unconfirmed_usage(stack, desk) -> None:
    apps.covers_a_lost_step(APP, stack, desk)


@pytest.mark.kill
def test_a_worker_killed_at_a_random_moment_after_the_first_write(stack, desk) -> None:
    apps.resumes_a_kill_at_a_random_moment(APP, stack, desk)


@pytest.mark.parametrize(("kinds", "says"), apps.WRONG_KINDS)
def test_a_wrong_kinds_mapping_stops_the_worker_at_start(stack, desk, tmp_path, kinds, says):
    apps.refuses_to_start_on_wrong_kinds(APP, stack, desk, tmp_path / "team", kinds, says)


def test_a_run_naming_an_unregistered_framework_agent_is_refused_at_the_door(stack) -> None:
    apps.refuses_an_unregistered_agent(APP, stack)


def test_an_approval_held_tool_waits_and_is_sent_with_its_approval_id(stack, desk, tmp_path):
    apps.holds_a_refund_for_approval(APP, stack, desk, tmp_path / "team")
