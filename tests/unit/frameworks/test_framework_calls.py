"""What the framework adapters share (runtime/frameworks/calls.py): a chat request sent
without the OpenAI SDK's per-message transform leaves byte for byte as the SDK sends it."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from typing import Any

import pytest
from openai import NOT_GIVEN, AsyncOpenAI, omit

from runtime.frameworks.calls import plain_chat_body
from tests.support.loopback import serving

ANSWER = json.dumps(
    {
        "id": "x",
        "object": "chat.completion",
        "created": 0,
        "model": "m",
        "choices": [
            {"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}
        ],
    }
).encode()


@pytest.fixture
def endpoint() -> Iterator[tuple[str, list[dict[str, Any]]]]:
    """A local chat-completions endpoint that keeps every body it was sent."""
    bodies: list[dict[str, Any]] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            bodies.append(json.loads(self.rfile.read(int(self.headers["content-length"]))))
            self.send_response(200)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(ANSWER)))
            self.end_headers()
            self.wfile.write(ANSWER)

        def log_message(self, *args: Any) -> None:
            pass

    with serving(Handler) as url:
        yield f"{url}/v1", bodies


MESSAGES: list[dict[str, Any]] = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": [{"type": "text", "text": "refund A-1"}]},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "refund", "arguments": "{}"}}
        ],
    },
    {"role": "tool", "tool_call_id": "c1", "content": '{"ok": true}'},
]
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "refund",
            "description": "Refund an order.",
            "parameters": {"type": "object", "properties": {"order_id": {"type": "string"}}},
            "strict": True,
        },
    }
]


def _send(client: AsyncOpenAI, **kwargs: Any) -> None:
    asyncio.run(client.chat.completions.create(model="m", **kwargs))


@pytest.mark.parametrize(
    "kwargs",
    [
        {"messages": MESSAGES, "tools": TOOLS, "temperature": 0.5},
        {"messages": MESSAGES, "tools": omit, "tool_choice": NOT_GIVEN},  # nothing given
        {"messages": tuple(MESSAGES), "tools": TOOLS, "extra_body": {"seed": 7}},
        # A key set to "not given" inside a message is dropped, as the SDK drops it.
        {"messages": [{"role": "user", "content": "hi", "name": NOT_GIVEN}], "tools": TOOLS},
    ],
    ids=["tools", "not-given", "tuple-and-extra-body", "not-given-inside"],
)
def test_the_body_is_the_one_the_sdk_sends(
    endpoint: tuple[str, list[dict[str, Any]]], kwargs: dict[str, Any]
) -> None:
    url, bodies = endpoint
    _send(AsyncOpenAI(base_url=url, api_key="k", max_retries=0), **kwargs)
    _send(plain_chat_body(AsyncOpenAI(base_url=url, api_key="k", max_retries=0)), **kwargs)
    through_sdk, plain = bodies
    assert plain == through_sdk
