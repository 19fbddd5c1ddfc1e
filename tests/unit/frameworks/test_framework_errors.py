"""A failed model call through either framework adapter is a ModelError by the engine's one
rule (`runtime/models/errors.classify`), as the native providers' are: each adapter's own
OpenAI client sent through the send guard to a local server that answers 409, 429 with a
Retry-After, 429 out of quota, 503, 501, or drops the connection."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler
from typing import Any

import httpx2
import openai
import pytest
from agents import Agent as AgentsAgent
from agents import OpenAIChatCompletionsModel
from agents.exceptions import ModelBehaviorError
from pydantic_ai import Agent, exceptions
from pydantic_ai.models.openai import OpenAIChatModel
from pydantic_ai.providers.openai import OpenAIProvider

from liyagent.adapters.openai_agents import durable as agents_durable
from liyagent.adapters.pydantic_ai import durable as pydantic_durable
from runtime.frameworks.calls import model_error
from runtime.models.base import ModelError, StepRequest
from runtime.sending import bounded
from tests.support.hostile_model import hostile_model
from tests.support.loopback import serving

RUN = "run-errfold-7"


def _error(message: str, code: str) -> dict[str, Any]:
    return {"error": {"message": message, "type": "requests", "code": code}}


# Path -> (status, headers, body): what the server answers a chat request under that base URL.
ANSWERS: dict[str, tuple[int, dict[str, str], dict[str, Any]]] = {
    "conflict": (409, {}, _error("another request is in progress", "conflict")),
    "slow-down": (429, {"Retry-After": "7"}, _error("Rate limit reached", "rate_limit_exceeded")),
    "slow-down-ms": (
        429,
        {"retry-after-ms": "1500", "Retry-After": "9"},
        _error("Rate limit reached", "rate_limit_exceeded"),
    ),
    "no-quota": (429, {}, _error("You exceeded your current quota", "insufficient_quota")),
    "unavailable": (503, {"Retry-After": "2"}, _error("The server is overloaded", "overloaded")),
    "not-implemented": (501, {}, _error("not implemented", "not_implemented")),
    "busy": (503, {}, _error("The server is overloaded", "overloaded")),
}
# Chat requests the server was sent, per case.
SEEN: dict[str, int] = {}


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    """A local chat-completions endpoint: `/<case>/v1/chat/completions` answers the case's
    error; `/drop/...` closes the connection without an answer."""

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("content-length") or 0))
            case = self.path.strip("/").split("/")[0]
            SEEN[case] = SEEN.get(case, 0) + 1
            if case == "slow":
                time.sleep(2)
            if case not in ANSWERS:  # "drop": no status line at all
                self.connection.shutdown(socket.SHUT_RDWR)
                self.close_connection = True
                return
            status, headers, body = ANSWERS[case]
            raw = json.dumps(body).encode()
            self.send_response(status)
            for name, value in headers.items():
                self.send_header(name, value)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(raw)))
            self.end_headers()
            self.wfile.write(raw)

        def log_message(self, *args: Any) -> None:
            pass

    with serving(Handler) as url:
        yield url


def _pydantic_ai_step(base_url: str) -> None:
    model = OpenAIChatModel("m", provider=OpenAIProvider(base_url=base_url, api_key="k"))
    provider = pydantic_durable(Agent(model, name="desk")).provider()
    provider.next_step(StepRequest(RUN, 1, 1, [{"role": "user", "content": "hi"}], []))


def _openai_agents_step(base_url: str) -> None:
    model = OpenAIChatCompletionsModel("m", openai.AsyncOpenAI(base_url=base_url, api_key="k"))
    provider = agents_durable(AgentsAgent(name="desk", model=model)).provider()
    provider.next_step(StepRequest(RUN, 1, 1, [{"role": "user", "content": "hi"}], []))


STEPS = pytest.mark.parametrize(
    "step", [_pydantic_ai_step, _openai_agents_step], ids=["pydantic-ai", "openai-agents"]
)


def _failure(step: Callable[[str], None], base_url: str) -> ModelError:
    with pytest.raises(ModelError) as raised:
        step(base_url)
    assert raised.value.args[0].startswith(f"run {RUN}: "), raised.value.args[0]
    return raised.value


@STEPS
@pytest.mark.parametrize(
    ("case", "retryable", "after", "said"),
    [
        ("conflict", False, None, "HTTP 409 (conflict)"),
        ("slow-down", True, 7.0, "HTTP 429 (rate_limit_exceeded); asking again may help"),
        ("slow-down-ms", True, 1.5, "HTTP 429"),
        ("no-quota", False, None, "out of quota"),
        ("unavailable", True, 2.0, "HTTP 503 (overloaded)"),
        ("not-implemented", False, None, "HTTP 501"),
    ],
)
def test_an_http_error_is_classified_by_the_engines_rule(
    server: str,
    step: Callable[[str], None],
    case: str,
    retryable: bool,
    after: float | None,
    said: str,
) -> None:
    error = _failure(step, f"{server}/{case}/v1")
    assert error.retryable is retryable, str(error)
    assert error.retry_after_s == after
    # A 429 (not out of quota) closes the endpoint for the fleet and is never a failure.
    assert error.rate_limited is case.startswith("slow-down")
    assert said in str(error)
    assert ANSWERS[case][2]["error"]["message"] not in str(error)  # the provider's text: withheld


@STEPS
@pytest.mark.parametrize("declared", [False, True], ids=["chunked", "declared"])
def test_an_answer_past_the_bound_is_cut_off_and_not_asked_again(
    step: Callable[[str], None], declared: bool
) -> None:
    """The bound the engine sets around a model step holds for the frameworks' own clients:
    their SDK is handed at most the bound, then the read stops and the connection closes."""
    with (
        hostile_model(64 << 20, declared=declared) as model,
        bounded.answers_at_most(256 << 10),
    ):
        error = _failure(step, f"{model.base_url}/v1")
    assert error.retryable is False
    assert "LIYAGENT_MODEL_RESPONSE_MAX_BYTES (now 262144)" in str(error)
    assert sum(model.bytes_sent()) < 24 << 20  # asked once, read no further than the bound


@STEPS
def test_a_dropped_connection_is_worth_asking_again(
    server: str, step: Callable[[str], None]
) -> None:
    error = _failure(step, f"{server}/drop/v1")
    assert error.retryable is True and error.retry_after_s is None
    assert "connection to the model provider failed" in str(error)


@STEPS
def test_a_url_that_cannot_be_called_is_not_asked_again(step: Callable[[str], None]) -> None:
    error = _failure(step, "ftp://127.0.0.1:9/v1")
    assert error.retryable is False
    assert "check base_url" in str(error)


def test_the_agents_own_request_timeout_is_a_timeout_worth_asking_again(server: str) -> None:
    model = OpenAIChatModel("m", provider=OpenAIProvider(base_url=f"{server}/slow/v1", api_key="k"))
    agent = Agent(model, name="desk", model_settings={"request_timeout": 0.2})
    provider = pydantic_durable(agent).provider()
    with pytest.raises(ModelError) as raised:
        provider.next_step(StepRequest(RUN, 1, 1, [{"role": "user", "content": "hi"}], []))
    assert raised.value.retryable is True
    assert str(raised.value).startswith(f"run {RUN}: the model provider did not answer in time")


def test_the_agents_own_max_retries_never_asks_a_step_twice(server: str) -> None:
    """The engine decides when a step is asked again: a `max_retries` in the model's or the
    agent's settings is left out, so the SDK sends a step's request once."""
    model = OpenAIChatModel(
        "m",
        provider=OpenAIProvider(base_url=f"{server}/busy/v1", api_key="k"),
        settings={"max_retries": 3},
    )
    agent = Agent(model, name="desk", model_settings={"max_retries": 2})
    provider = pydantic_durable(agent).provider()
    with pytest.raises(ModelError) as raised:
        provider.next_step(StepRequest(RUN, 1, 1, [{"role": "user", "content": "hi"}], []))
    assert raised.value.retryable is True
    assert SEEN["busy"] == 1


def _request() -> httpx2.Request:
    return httpx2.Request("POST", "http://127.0.0.1:9/v1/chat/completions")


def _chained(outer: BaseException, inner: BaseException) -> BaseException:
    outer.__cause__ = inner
    return outer


def test_a_timeout_under_either_sdk_is_a_timeout_worth_asking_again() -> None:
    sdk = _chained(openai.APITimeoutError(request=_request()), httpx2.ReadTimeout("read timed out"))
    bare = openai.APITimeoutError(request=_request())  # no transport error under it
    wrapped = _chained(exceptions.ModelTimeoutError("m", "Request timed out."), bare)
    for exc in (sdk, bare, wrapped):
        error = model_error(RUN, exc)
        assert error.retryable is True, exc
        assert str(error).startswith(f"run {RUN}: the model provider did not answer in time")


def test_a_connection_failure_under_either_sdk_is_worth_asking_again() -> None:
    bare = openai.APIConnectionError(request=_request())
    wrapped = _chained(exceptions.ModelConnectionError("m", "Connection error."), bare)
    for exc in (bare, wrapped):
        error = model_error(RUN, exc)
        assert error.retryable is True, exc
        assert "connection to the model provider failed" in str(error)


def test_an_http_error_without_its_response_is_read_from_the_frameworks_error() -> None:
    # Pydantic AI reports an error sent inside a stream with the status the provider uses for
    # it and no SDK response under it: its status, headers and body are what there is.
    quota = exceptions.ModelHTTPError(
        429, "m", body={"message": "You exceeded your quota", "code": "insufficient_quota"}
    )
    assert model_error(RUN, quota).retryable is False
    busy = exceptions.ModelHTTPError(
        429, "m", body={"message": "slow"}, headers={"Retry-After": "3"}
    )
    error = model_error(RUN, busy)
    assert error.retryable is True and error.retry_after_s == 3.0
    said = "the model provider answered HTTP 429; asking again may help"
    assert str(error) == f"run {RUN}: {said}"


def test_an_answer_the_framework_cannot_use_is_not_asked_again() -> None:
    for exc in (
        exceptions.UnexpectedModelBehavior("Received empty model response"),
        ModelBehaviorError("Invalid JSON when parsing the model's output"),
        openai.APIResponseValidationError(
            response=httpx2.Response(200, request=_request()), body=None
        ),
    ):
        error = model_error(RUN, exc)
        assert error.retryable is False, exc
        assert str(error).startswith(f"run {RUN}: ")
