"""The Anthropic Messages API provider against recorded responses served over loopback: the
request it sends, the answers it parses, how it classifies failures, and whole runs on real
workers, including a worker killed between the model's answer and its checkpoint."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from runtime.models.anthropic import AnthropicProvider
from runtime.models.base import ModelError, StepRequest
from runtime.models.profiles import BUILT_IN
from runtime.models.specs import check
from runtime.sending import http
from tests.support.models import anthropic_at
from tests.support.recorded import (
    FINAL,
    TICKET_TOOL,
    RecordedServer,
    Reply,
    first_step,
    recorded_servers,
)
from tests.support.stand_in_lease import Lease

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "anthropic"
KEY_ENV = "LYT_ANTHROPIC_KEY"
FIRST_CALL = "toolu_01A09q90qw90lq917835lq9"  # ticket_read_tool_use.json


@pytest.fixture
def serve() -> Iterator[Any]:
    with recorded_servers(FIXTURES) as start:
        yield start


@pytest.fixture
def api_key(monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv(KEY_ENV, "sk-ant-test-loopback")
    return "sk-ant-test-loopback"


def provider_for(server: RecordedServer, **extra: Any) -> AnthropicProvider:
    spec = {"model": "claude-sonnet-4-6", "timeout_s": 5, **extra}
    return anthropic_at(server.base_url, KEY_ENV, **spec)


def later_step() -> StepRequest:
    """Step 3 after a step with two calls and a step with one: results merge per turn."""
    messages = [
        {"role": "system", "content": "You are a support agent."},
        {"role": "user", "content": "Checkout is failing"},
        {
            "role": "assistant",
            "content": "Reading both.",
            "tool_calls": [
                {"id": "toolu_a", "name": "ticket.read", "args": {"ticket": "T-1"}},
                {"id": "toolu_b", "name": "incident.create", "args": {"title": "Down"}},
            ],
        },
        {"role": "tool", "tool_call_id": "toolu_a", "name": "ticket.read", "content": '{"id": 1}'},
        {
            "role": "tool",
            "tool_call_id": "toolu_b",
            "name": "incident.create",
            "content": '{"error": "refused"}',
        },
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"id": "toolu_c", "name": "ticket.read", "args": {"ticket": "T-2"}}],
        },
        {"role": "tool", "tool_call_id": "toolu_c", "name": "ticket.read", "content": "{}"},
    ]
    return StepRequest("run-1", 1, 3, messages, [TICKET_TOOL])


# --- the provider over loopback ------------------------------------------------------------


def test_the_request_has_model_system_messages_tools_and_key(serve, api_key) -> None:
    server = serve(Reply("ticket_read_tool_use"))
    provider_for(server, max_tokens=300, temperature=0).next_step(first_step())
    [got] = server.received
    assert got.path == "/v1/messages"
    assert got.headers["authorization"] == f"Bearer {api_key}"  # how this SDK sends the key
    assert got.headers["anthropic-version"]
    assert (got.headers["X-Liyagent-Run"], got.headers["X-Liyagent-Step"]) == ("run-1", "1")
    assert got.body == {
        "model": "claude-sonnet-4-6",
        "max_tokens": 300,
        "system": "You are a support agent.",
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "What is T-1's priority?"}]}
        ],
        "tools": [
            {
                "name": "ticket__read",
                "description": "Read a ticket by id.",
                "input_schema": TICKET_TOOL["parameters"],
            }
        ],
        "temperature": 0.0,
    }


def test_max_tokens_is_sent_by_default(serve, api_key) -> None:
    server = serve(Reply("final_text"))
    provider_for(server).next_step(first_step())
    assert server.received[0].body["max_tokens"] == 1024


def test_tool_uses_and_results_map_to_blocks_and_merged_user_turns(serve, api_key) -> None:
    server = serve(Reply("final_text"))
    provider_for(server).next_step(later_step())
    messages = server.received[0].body["messages"]
    assert [m["role"] for m in messages] == ["user", "assistant", "user", "assistant", "user"]
    assert messages[1]["content"] == [
        {"type": "text", "text": "Reading both."},
        {"type": "tool_use", "id": "toolu_a", "name": "ticket__read", "input": {"ticket": "T-1"}},
        {
            "type": "tool_use",
            "id": "toolu_b",
            "name": "incident__create",
            "input": {"title": "Down"},
        },
    ]
    # Both results of one step in one user turn; a refusal flagged as an error.
    assert messages[2]["content"] == [
        {"type": "tool_result", "tool_use_id": "toolu_a", "content": '{"id": 1}'},
        {
            "type": "tool_result",
            "tool_use_id": "toolu_b",
            "content": '{"error": "refused"}',
            "is_error": True,
        },
    ]
    assert messages[3]["content"][0]["id"] == "toolu_c"  # no empty text block
    assert messages[4]["content"] == [
        {"type": "tool_result", "tool_use_id": "toolu_c", "content": "{}"}
    ]


def test_tool_uses_come_back_under_our_names_with_their_ids(serve, api_key) -> None:
    server = serve(Reply("two_tool_uses"))
    answer = provider_for(server).next_step(first_step())
    assert [(c.id, c.name, c.args) for c in answer.calls] == [
        ("toolu_01NcTb7vE4dQhPjW9sKy2fZ3", "ticket.read", {"ticket": "T-1"}),
        (
            "toolu_01GpVx6mR2aJ8kLq5wHs3nBe",
            "incident.create",
            {"title": "Checkout is down", "severity": "sev2"},
        ),
    ]
    assert answer.text == "Checkout looks down. I'll read the ticket and open an incident."


def test_end_turn_text_is_the_final_answer(serve, api_key) -> None:
    answer = provider_for(serve(Reply("final_text"))).next_step(first_step())
    assert answer.final and answer.text == FINAL


@pytest.mark.parametrize(
    ("fixture", "status", "says"),
    [("error_429", 429, "rate_limit_error"), ("error_529", 529, "overloaded_error")],
)
def test_429_and_529_are_retryable_after_the_providers_delay(
    serve, api_key, fixture, status, says
) -> None:
    server = serve(Reply(fixture, status=status, headers={"retry-after": "3"}))
    with pytest.raises(ModelError) as info:
        provider_for(server).next_step(first_step())
    assert info.value.retryable
    assert info.value.retry_after_s == 3.0
    assert f"HTTP {status} ({says})" in str(info.value)
    assert len(server.received) == 1  # the SDK itself never asked again


def test_401_fails_with_the_providers_error_type_and_the_key_variable(serve, api_key) -> None:
    server = serve(Reply("error_401", status=401))
    with pytest.raises(ModelError) as info:
        provider_for(server).next_step(first_step())
    assert not info.value.retryable
    assert "HTTP 401 (authentication_error)" in str(info.value)
    assert "invalid x-api-key" not in str(info.value)
    assert f"check that {KEY_ENV} holds a valid API key" in str(info.value)


def test_404_says_to_check_the_host_and_model(serve, api_key) -> None:
    server = serve(Reply("error_404", status=404))
    with pytest.raises(ModelError) as info:
        provider_for(server).next_step(first_step())
    assert not info.value.retryable
    assert "HTTP 404 (not_found_error)" in str(info.value) and "the host only" in str(info.value)


def test_a_missing_key_variable_fails_before_any_request(serve, monkeypatch) -> None:
    monkeypatch.delenv(KEY_ENV, raising=False)
    server = serve(Reply("final_text"))
    with pytest.raises(ModelError, match=f"{KEY_ENV} \\(api_key_env\\) is not set"):
        provider_for(server).next_step(first_step())
    assert server.received == []


def test_a_tool_use_input_that_is_not_an_object_is_kept_for_the_model(serve, api_key) -> None:
    [call] = provider_for(serve(Reply("bad_tool_input"))).next_step(first_step()).calls
    assert call.args == {} and call.args_error == "the input is a JSON str, not an object"


def test_a_tool_use_cut_at_max_tokens_fails_the_step_naming_the_run(serve, api_key) -> None:
    with pytest.raises(ModelError) as info:
        provider_for(serve(Reply("cut_at_max_tokens"))).next_step(first_step())
    assert not info.value.retryable
    assert "run run-1" in str(info.value) and "cut off at max_tokens" in str(info.value)


@pytest.mark.parametrize(
    ("spec", "says"),
    [
        ({"api_key": "sk-ant-oops"}, "model.api_key: a secret is never put"),
        ({"max_tokens": "many"}, "max_tokens"),
        ({"model": ""}, "model"),
    ],
)
def test_a_bad_spec_is_refused_with_what_to_fix(spec, says) -> None:
    with pytest.raises(ModelError) as info:
        check({"provider": "anthropic", "model": "claude-sonnet-4-6", **spec}, BUILT_IN)
    assert not info.value.retryable
    assert says in str(info.value)


def test_a_server_slower_than_the_timeout_is_retryable(serve, api_key) -> None:
    server = serve(Reply("final_text", delay_s=2.0))
    started = time.monotonic()
    with pytest.raises(ModelError) as info:
        provider_for(server, timeout_s=0.5).next_step(first_step())
    assert time.monotonic() - started < 1.8
    assert info.value.retryable and "did not answer in time" in str(info.value)


def test_a_closed_port_is_a_retryable_connection_error(serve, api_key) -> None:
    server = serve()
    provider = provider_for(server)
    server.close()
    with pytest.raises(ModelError) as info:
        provider.next_step(first_step())
    assert info.value.retryable and "ConnectError" in str(info.value)


def test_the_send_guard_applies_to_the_sdks_requests(serve, api_key) -> None:
    server = serve(Reply("final_text"))
    with http.guarded(Lease(until=time.monotonic() - 1)), pytest.raises(http.SendRefused):
        provider_for(server).next_step(first_step())
    assert server.received == []


# --- whole runs on real workers -------------------------------------------------------------


def declared(stack, server: RecordedServer) -> RecordedServer:
    """The recorded server declared as a model profile of the deployment (before any worker
    starts: each reads the profiles once)."""
    stack.declare_model("recorded", "anthropic", server.base_url, "ANTHROPIC_API_KEY")
    return server


def start_run(stack, server: RecordedServer, tools: list[str] | None = None) -> str:
    model = {
        "provider": "anthropic",
        "base_url": server.base_url,
        "model": "claude-sonnet-4-6",
        "max_tokens": 512,
    }
    return str(
        stack.client.start_run(
            agent="an",
            model=model,
            user_input="What is T-1's priority?",
            system="You are a support agent.",
            tools=tools or ["ticket.read"],
        )
    )


@pytest.fixture
def worker_key(monkeypatch: pytest.MonkeyPatch) -> str:
    """The key every worker started by the test has (they inherit this environment)."""
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-worker-key")
    return "sk-ant-worker-key"


def test_a_tool_use_round_trip_on_a_real_worker(stack, serve, worker_key) -> None:
    server = declared(stack, serve(Reply("ticket_read_tool_use"), Reply("final_text")))
    stack.worker()
    run_id = start_run(stack, server)
    view = stack.wait(run_id)
    assert view.status == "succeeded", view
    assert view.answer == FINAL
    first, second = server.received
    assert first.headers["authorization"] == f"Bearer {worker_key}"
    assert second.body["system"] == "You are a support agent."
    user, assistant, results = second.body["messages"]
    assert user["role"] == "user"
    assert assistant == {
        "role": "assistant",
        "content": [
            {"type": "text", "text": "I'll look up ticket T-1 to check its priority."},
            {
                "type": "tool_use",
                "id": FIRST_CALL,
                "name": "ticket__read",
                "input": {"ticket": "T-1"},
            },
        ],
    }
    [result] = results["content"]
    assert result["type"] == "tool_result" and result["tool_use_id"] == FIRST_CALL
    assert json.loads(result["content"])["id"] == "T-1"
    assert server.requests_of(run_id) == [(1, 1, 1), (2, 1, 1)]
    # The provider's stable toolu_ id gave the call its key: the ticket read went out once.
    [[reads]] = stack.vendor(
        "SELECT count(*) FROM sim.requests WHERE run_id = :r AND vendor = 'tickets'", r=run_id
    )
    assert reads == 1


def test_a_529_is_asked_again_by_the_engine_after_its_delay(stack, serve, worker_key) -> None:
    server = declared(
        stack,
        serve(Reply("error_529", status=529, headers={"retry-after": "1"}), Reply("final_text")),
    )
    stack.worker()
    run_id = start_run(stack, server)
    view = stack.wait(run_id)
    assert view.status == "succeeded", view
    assert server.requests_of(run_id) == [(1, 1, 2)]
    assert server.received[0].body == server.received[1].body


@pytest.mark.kill
def test_a_crash_between_the_answer_and_its_checkpoint_asks_that_step_once_more(
    stack, serve, worker_key
) -> None:
    server = serve(
        Reply("ticket_read_tool_use"),  # step 1, written
        Reply("ticket_read_again_tool_use"),  # step 2: answered, the worker dies before writing
        Reply("ticket_read_again_tool_use"),  # step 2 asked again by the survivor
        Reply("final_text"),  # step 3
    )
    declared(stack, server)
    run_id = stack.kill_at("after_model_step:kill:2", lambda: start_run(stack, server))
    assert server.requests_of(run_id) == [(1, 1, 1), (2, 1, 1)]
    stack.worker("survivor")
    stack.beat()
    view = stack.wait(run_id)
    assert view.status == "succeeded", view
    assert view.answer == FINAL
    # The written step 1 was never asked again; the unwritten step 2 exactly once more.
    assert server.requests_of(run_id) == [(1, 1, 1), (2, 1, 1), (2, 2, 1), (3, 2, 1)]
    tickets = stack.vendor(
        "SELECT path, count(*) AS n FROM sim.requests WHERE run_id = :r "
        "AND vendor = 'tickets' GROUP BY 1 ORDER BY 1",
        r=run_id,
    )
    # The lost step's read was never made by the victim (its calls were never written), once by
    # the survivor; the last written step's read, never recorded (reads are not), made again.
    assert [(t.path, t.n) for t in tickets] == [("/tickets/T-1", 2), ("/tickets/T-2", 1)]
