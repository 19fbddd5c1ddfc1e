"""The OpenAI provider against recorded responses served over loopback: the request it sends,
the answers it parses, how it classifies failures, and whole runs on a real worker."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from runtime import services as runtime_services
from runtime.entries.client import Client
from runtime.models.base import ModelError
from runtime.models.openai import OpenAIProvider
from tests.support.models import openai_at
from tests.support.recorded import (
    FINAL,
    TICKET_TOOL,
    RecordedServer,
    Reply,
    first_step,
    recorded_servers,
)

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "openai"
TICKET_CALL_ID = "call_Ab3Kp9Lq2Wx7Zt5Rn1Ms8Dv4"  # the id in ticket_read_call.json


@pytest.fixture
def serve() -> Iterator[Any]:
    with recorded_servers(FIXTURES, "/v1") as start:
        yield start


@pytest.fixture
def api_key(monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv("TEST_OPENAI_KEY", "sk-test-loopback")
    return "sk-test-loopback"


def provider_for(server: RecordedServer, **extra: Any) -> OpenAIProvider:
    spec = {"model": "gpt-test", "temperature": 0, "timeout_s": 5, **extra}
    return openai_at(server.base_url, "TEST_OPENAI_KEY", **spec)


# --- the provider over loopback ------------------------------------------------------------


def test_the_request_has_the_model_messages_tools_and_key(serve, api_key) -> None:
    server = serve(Reply("ticket_read_call"))
    provider_for(server, max_tokens=300).next_step(first_step())
    [got] = server.received
    assert got.path == "/v1/chat/completions"
    assert got.headers["Authorization"] == f"Bearer {api_key}"
    assert got.headers["Content-Type"] == "application/json"
    # Who asks, for the model server's own records: the run, its attempt and the step.
    assert (got.headers["X-Liyagent-Run"], got.headers["X-Liyagent-Step"]) == ("run-1", "1")
    assert got.body == {
        "model": "gpt-test",
        "messages": [
            {"role": "system", "content": "You are a support agent."},
            {"role": "user", "content": "What is T-1's priority?"},
        ],
        "tools": [
            {
                "type": "function",
                "function": {
                    "name": "ticket__read",
                    "description": "Read a ticket by id.",
                    "parameters": TICKET_TOOL["parameters"],
                },
            }
        ],
        "temperature": 0.0,
        "max_tokens": 300,
    }


def test_tool_calls_come_back_under_our_names(serve, api_key) -> None:
    server = serve(Reply("tool_calls"))
    answer = provider_for(server).next_step(first_step())
    assert [(c.id, c.name, c.args) for c in answer.calls] == [
        ("call_Xq8vR2mJ5tLb9KcW1nPd4sYe", "ticket.read", {"ticket": "T-1"}),
        (
            "call_7HfT3aNq0gVz6UsM2rBk8oLc",
            "incident.create",
            {"title": "Checkout is down", "severity": "sev2"},
        ),
    ]
    assert len(server.received) == 1


def test_a_final_text_ends_the_run(serve, api_key) -> None:
    server = serve(Reply("final_text"))
    answer = provider_for(server).next_step(first_step())
    assert answer.final
    assert answer.text == FINAL


def test_429_is_retryable_after_the_providers_delay(serve, api_key) -> None:
    server = serve(Reply("error_429", status=429, headers={"Retry-After": "2"}))
    with pytest.raises(ModelError) as info:
        provider_for(server).next_step(first_step())
    assert info.value.retryable
    assert info.value.retry_after_s == 2.0
    assert "HTTP 429 (rate_limit_exceeded)" in str(info.value)
    assert "Rate limit reached" not in str(info.value)  # the provider's text is withheld
    assert len(server.received) == 1  # the client itself never asked again


def test_429_with_retry_after_ms_prefers_the_precise_delay(serve, api_key) -> None:
    headers = {"retry-after-ms": "120", "retry-after": "1"}
    server = serve(Reply("error_429", status=429, headers=headers))
    with pytest.raises(ModelError) as info:
        provider_for(server).next_step(first_step())
    assert info.value.retry_after_s == pytest.approx(0.12)


def test_401_fails_with_the_providers_code_and_the_key_variable(serve, api_key) -> None:
    server = serve(Reply("error_401", status=401))
    with pytest.raises(ModelError) as info:
        provider_for(server).next_step(first_step())
    assert not info.value.retryable
    text = str(info.value)
    assert "HTTP 401 (invalid_api_key)" in text
    assert "Incorrect API key provided" not in text  # its message quotes the key sent
    assert "TEST_OPENAI_KEY" in text


def test_500_is_retryable_without_a_delay_of_its_own(serve, api_key) -> None:
    server = serve(Reply("error_500", status=500))
    with pytest.raises(ModelError) as info:
        provider_for(server).next_step(first_step())
    assert info.value.retryable
    assert info.value.retry_after_s is None
    assert len(server.received) == 1


def test_a_server_slower_than_the_timeout_is_retryable(serve, api_key) -> None:
    server = serve(Reply("final_text", delay_s=2.0))
    started = time.monotonic()
    with pytest.raises(ModelError) as info:
        provider_for(server, timeout_s=0.5).next_step(first_step())
    assert time.monotonic() - started < 1.8
    assert info.value.retryable
    assert "ReadTimeout" in str(info.value)


def test_malformed_arguments_are_kept_for_the_model_to_be_told(serve, api_key) -> None:
    server = serve(Reply("bad_arguments"))
    [call] = provider_for(server).next_step(first_step()).calls
    assert call.args == {} and call.raw_args
    assert call.args_error is not None and "not valid JSON" in call.args_error


def test_a_closed_port_is_a_retryable_connection_error(serve, api_key) -> None:
    server = serve()
    url = server.base_url
    server.close()
    provider = openai_at(url, "TEST_OPENAI_KEY")
    with pytest.raises(ModelError) as info:
        provider.next_step(first_step())
    assert info.value.retryable
    assert "ConnectError" in str(info.value)


# --- whole runs on a real worker ------------------------------------------------------------


def own_worker(stack, server: RecordedServer) -> None:
    """A worker on a queue of this test's own: the suite's default queue name is shared by every
    test session on the same Redis, and another session's worker would take our message."""
    stack.reconfigure(queue=f"liyagent-oa-{uuid.uuid4().hex[:10]}")
    stack.declare_model("recorded", "openai", server.base_url, "OPENAI_API_KEY")
    stack.worker(env={"OPENAI_API_KEY": "test-key"})


def start_run(stack, server: RecordedServer) -> str:
    model = {"profile": "recorded", "model": "gpt-test"}
    return str(
        stack.client.start_run(
            agent="oa", model=model, user_input="What is T-1's priority?", tools=["ticket.read"]
        )
    )


def test_a_run_calls_a_tool_and_answers_on_a_real_worker(stack, serve) -> None:
    server = serve(Reply("ticket_read_call"), Reply("final_text"))
    own_worker(stack, server)
    run_id = start_run(stack, server)
    view = stack.wait(run_id, timeout=60)
    assert view.status == "succeeded", view
    assert view.answer == FINAL
    [[reads]] = stack.vendor(
        "SELECT count(*) FROM sim.requests WHERE run_id = :r AND vendor='tickets'", r=run_id
    )
    assert reads == 1
    first, second = server.received
    assert first.headers["Authorization"] == "Bearer test-key"
    assert [t["function"]["name"] for t in first.body["tools"]] == ["ticket__read"]
    messages = second.body["messages"]
    assistant = next(m for m in messages if m["role"] == "assistant")
    assert assistant["tool_calls"] == [
        {
            "id": TICKET_CALL_ID,
            "type": "function",
            "function": {"name": "ticket__read", "arguments": '{"ticket": "T-1"}'},
        }
    ]
    [result] = [m for m in messages if m["role"] == "tool"]
    assert result["tool_call_id"] == TICKET_CALL_ID
    assert json.loads(result["content"])["id"] == "T-1"
    assert server.requests_of(run_id) == [(1, 1, 1), (2, 1, 1)]


def test_a_503_is_asked_again_by_the_engine_and_the_run_succeeds(stack, serve) -> None:
    server = serve(
        Reply("error_503", status=503, headers={"Retry-After": "1"}), Reply("final_text")
    )
    own_worker(stack, server)
    run_id = start_run(stack, server)
    view = stack.wait(run_id, timeout=60)
    assert view.status == "succeeded", view
    assert view.answer == FINAL
    # Two requests reached the server, both as step 1 of attempt 1: the engine asked again,
    # not the HTTP client (which never retries).
    assert len(server.received) == 2
    assert server.received[0].body == server.received[1].body
    assert server.requests_of(run_id) == [(1, 1, 2)]


def test_a_rejected_key_fails_the_run_with_what_to_do(stack, serve) -> None:
    server = serve(Reply("error_401", status=401))
    own_worker(stack, server)
    run_id = start_run(stack, server)
    view = stack.wait(run_id, timeout=60)
    assert view.status == "failed", view
    assert "HTTP 401" in (view.failure_reason or "")
    assert "check that OPENAI_API_KEY holds a valid API key" in (view.failure_reason or "")
    assert len(server.received) == 1


def test_an_endpoint_the_worker_does_not_declare_is_never_called(stack, serve) -> None:
    """Fail closed at the worker too: a run stored by a process whose profiles name an endpoint
    (here, an app process told of one) is checked again against the worker's own profiles;
    the worker fails it, naming the profile, and sends nothing, its key least of all."""
    server = serve(Reply("final_text"))
    stack.reconfigure(queue=f"liyagent-oa-{uuid.uuid4().hex[:10]}")
    stack.worker(env={"OPENAI_API_KEY": "worker-secret-key"})
    app_profiles = json.loads(stack.settings.model_profiles)
    app_profiles["elsewhere"] = {
        "provider": "openai",
        "base_url": server.base_url,
        "api_key_env": "OPENAI_API_KEY",
    }
    app = runtime_services.build(
        replace(stack.settings, model_profiles=json.dumps(app_profiles)),
        stack.services.publisher,
        sealer=stack.sealer,
    )
    run_id = Client(app).start_run(
        agent="oa", model={"profile": "elsewhere", "model": "gpt-test"}, user_input="hi"
    )
    view = stack.wait(run_id, timeout=60)
    assert view.status == "failed", view
    reason = view.failure_reason or ""
    assert "model.profile is not a profile this deployment declares" in reason
    assert server.received == []
