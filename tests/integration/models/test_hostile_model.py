"""A hostile model endpoint, as the security probe met one (issue 30, items 5 and 8): a huge
answer is read only up to LIYAGENT_MODEL_RESPONSE_MAX_BYTES and a final answer over
LIYAGENT_STEP_MAX_BYTES is never stored; an error body that echoes the prompt and a key reaches
no failure reason, audit row, run event or log line. Through the providers over loopback, then
through real workers, judged from the server's own count of bytes sent and from Postgres."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from runtime.base.settings import get_settings
from runtime.models.anthropic import AnthropicProvider
from runtime.models.base import ModelError
from runtime.models.openai import OpenAIProvider
from runtime.sending import bounded
from tests.support.hostile_model import HostileModel, error_body, hostile_model
from tests.support.models import anthropic_at, openai_at
from tests.support.recorded import first_step

MIB = 1 << 20
KEY_ENV = "TEST_HOSTILE_KEY"


@pytest.fixture(autouse=True)
def api_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(KEY_ENV, "test-key")


@pytest.fixture
def settings_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[pytest.MonkeyPatch]:
    """The environment this process's settings are read from, read again after the test."""
    get_settings.cache_clear()
    yield monkeypatch
    monkeypatch.undo()
    get_settings.cache_clear()


def openai_provider(server: HostileModel) -> OpenAIProvider:
    return openai_at(f"{server.base_url}/v1", KEY_ENV, model="gpt-test", timeout_s=20)


def anthropic_provider(server: HostileModel) -> AnthropicProvider:
    return anthropic_at(server.base_url, KEY_ENV, model="claude-test", timeout_s=20)


# --- the providers over loopback ----------------------------------------------------------


@pytest.mark.parametrize(
    ("shape", "provider"), [("openai", openai_provider), ("anthropic", anthropic_provider)]
)
def test_a_huge_answer_is_read_only_up_to_the_bound(shape: str, provider: Any) -> None:
    """200 MB sent chunked (no length said): the read stops past the bound in force and the
    connection is closed, so the server could send only the bound and what the sockets hold."""
    with (
        hostile_model(200 * MIB, shape=shape) as server,
        pytest.raises(ModelError) as info,
        bounded.answers_at_most(256 << 10),
    ):
        provider(server).next_step(first_step())
    assert not info.value.retryable
    said = str(info.value)
    assert "run run-1" in said and "LIYAGENT_MODEL_RESPONSE_MAX_BYTES (now 262144)" in said
    assert "more than 262144 bytes" in said and "aaaa" not in said
    [sent] = server.bytes_sent()
    assert sent < 32 * MIB, f"the server sent {sent} bytes: the worker read on"


@pytest.mark.parametrize(
    ("shape", "provider"), [("openai", openai_provider), ("anthropic", anthropic_provider)]
)
def test_an_answer_declaring_more_than_the_bound_is_refused_unread(
    shape: str, provider: Any, settings_env: pytest.MonkeyPatch
) -> None:
    """Outside a run the process's own setting is the bound; a declared length over it is
    refused before any byte of the body is read."""
    settings_env.setenv("LIYAGENT_MODEL_RESPONSE_MAX_BYTES", str(MIB))
    with (
        hostile_model(200 * MIB, shape=shape, declared=True) as server,
        pytest.raises(ModelError) as info,
    ):
        provider(server).next_step(first_step())
    assert not info.value.retryable
    assert f"declared {200 * MIB} bytes, more than {MIB}; none was read" in str(info.value)
    [sent] = server.bytes_sent()
    assert sent < 32 * MIB


@pytest.mark.parametrize(
    ("shape", "provider"), [("openai", openai_provider), ("anthropic", anthropic_provider)]
)
def test_an_answer_under_the_bound_is_read_whole(shape: str, provider: Any) -> None:
    with hostile_model(200 << 10, shape=shape) as server, bounded.answers_at_most(256 << 10):
        answer = provider(server).next_step(first_step())
    assert answer.final and answer.text is not None and len(answer.text) > 190 << 10


CANARY_KEY = f"sk-proj-{uuid.uuid4().hex}"


@pytest.mark.parametrize(
    ("shape", "provider"), [("openai", openai_provider), ("anthropic", anthropic_provider)]
)
@pytest.mark.parametrize("status", [400, 401, 500])
def test_an_error_body_echoing_the_prompt_and_a_key_is_not_quoted(
    shape: str, provider: Any, status: int
) -> None:
    prompt = first_step().messages[-1]["content"]
    body = error_body(prompt, CANARY_KEY)
    with hostile_model(status=status, error=body) as server, pytest.raises(ModelError) as info:
        provider(server).next_step(first_step())
    said = str(info.value)
    assert f"HTTP {status} (invalid_request_error)" in said
    assert CANARY_KEY not in said and prompt not in said and "T-1" not in said


# --- whole runs on real workers -------------------------------------------------------------


def own_worker(stack, server: HostileModel, **env: str) -> Any:
    """A worker on a queue of this test's own (another session's worker would take ours), the
    hostile server declared as a model profile of the deployment."""
    stack.reconfigure(queue=f"liyagent-hm-{uuid.uuid4().hex[:10]}")
    stack.declare_model("hostile", "openai", f"{server.base_url}/v1", "OPENAI_API_KEY")
    return stack.worker(env={"OPENAI_API_KEY": "test-key", **env})


def start_run(stack, server: HostileModel, user_input: str = "What is T-1's priority?") -> str:
    model = {"profile": "hostile", "model": "gpt-test"}
    return str(stack.client.start_run(agent="oa", model=model, user_input=user_input, tools=[]))


def stored_bytes(stack, run_id: str) -> dict[str, int]:
    """What Postgres holds of a run's answer: the sealed answer, its step records, its
    transcript's assistant messages."""
    [row] = stack.rows(
        "SELECT coalesce(octet_length(answer), 0) AS answer, "
        "(SELECT coalesce(sum(octet_length(sealed)), 0) FROM run_steps WHERE run_id = :r) "
        "AS steps, "
        "(SELECT coalesce(sum(octet_length(content)), 0) FROM transcript_messages "
        " WHERE run_id = :r AND role = 'assistant') AS said "
        "FROM runs WHERE id = :r",
        r=run_id,
    )
    return {"answer": row.answer, "steps": int(row.steps), "said": int(row.said)}


def failed_code(stack, run_id: str) -> str:
    [row] = stack.rows(
        "SELECT detail FROM audit_events WHERE run_id = :r AND kind = 'agent.run.failed'",
        r=run_id,
    )
    return str(row.detail["code"])


def test_a_huge_model_answer_stops_the_workers_read_and_fails_the_run(stack) -> None:
    with hostile_model(64 * MIB) as server:
        own_worker(stack, server, LIYAGENT_MODEL_RESPONSE_MAX_BYTES=str(MIB))
        run_id = start_run(stack, server)
        view = stack.wait(run_id, timeout=90)
    assert view.status == "failed", view
    reason = view.failure_reason or ""
    assert run_id in reason and f"more than {MIB} bytes" in reason
    assert "raise LIYAGENT_MODEL_RESPONSE_MAX_BYTES" in reason and "aaaa" not in reason
    [sent] = server.bytes_sent()  # asked once: an answer too large is not asked again
    assert sent < 24 * MIB, f"the server sent {sent} bytes: the worker read on"
    assert stored_bytes(stack, run_id) == {"answer": 0, "steps": 0, "said": 0}
    assert failed_code(stack, run_id) == "model_error"


def test_a_final_answer_over_the_step_bound_is_never_stored(stack) -> None:
    """2 MiB: within the read bound (4 MiB), over what a step may add (1 MiB)."""
    with hostile_model(2 * MIB) as server:
        own_worker(stack, server)
        run_id = start_run(stack, server)
        view = stack.wait(run_id, timeout=90)
    assert view.status == "failed", view
    reason = view.failure_reason or ""
    assert run_id in reason and "LIYAGENT_STEP_MAX_BYTES=1048576" in reason
    assert "its final answer was 2097" in reason and "aaaa" not in reason
    assert view.answer is None
    assert stored_bytes(stack, run_id) == {"answer": 0, "steps": 0, "said": 0}
    assert failed_code(stack, run_id) == "answer_too_large"


def test_a_providers_error_echoing_the_prompt_and_a_key_reaches_no_record(stack) -> None:
    prompt = f"Refund order O-77 to card ending 4242, ref CANARY-{uuid.uuid4().hex}"
    key = f"sk-proj-{uuid.uuid4().hex}"
    with hostile_model(status=400, error=error_body(prompt, key)) as server:
        worker = own_worker(stack, server)
        run_id = start_run(stack, server, user_input=prompt)
        view = stack.wait(run_id, timeout=90)
    assert view.status == "failed", view
    assert "HTTP 400 (invalid_request_error)" in (view.failure_reason or "")
    canaries = (key, prompt, "CANARY-")
    audit = stack.rows(
        "SELECT kind, detail::text AS d FROM audit_events WHERE run_id = :r", r=run_id
    )
    notices = stack.rows(
        "SELECT content FROM transcript_messages WHERE run_id = :r AND role <> 'user'", r=run_id
    )
    events = json.dumps([e.to_json() for e in stack.client.events(run_id).events], default=str)
    for canary in canaries:
        assert canary not in (view.failure_reason or "")
        assert not [a.kind for a in audit if canary in a.d]
        assert not [n for n in notices if canary in n.content]
        assert canary not in events
        assert canary not in worker.output()
