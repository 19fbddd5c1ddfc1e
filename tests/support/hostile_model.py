"""A hostile model endpoint on loopback, as the security probe met one: it answers every request
with a huge body and counts the bytes it managed to send before its client hung up (the judge of
how much a worker read), or with an error whose body echoes the prompt and a key.

A huge body is a chat-completions (or Messages API) answer whose text runs on for `size` bytes,
sent in 64 KiB chunks, either chunked (no length said: the client must count) or with its
`Content-Length` declared up front."""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from typing import Any

from tests.support.loopback import serving

CHUNK = 64 << 10


@dataclass
class HostileModel:
    """What the server answers (`size` bytes, `declared` or chunked, as `shape`; or, with
    `error`, that body with `status`) and the bytes of body it sent to each request, in order."""

    size: int
    declared: bool = False
    shape: str = "openai"
    status: int = 200
    error: bytes | None = None
    sent: list[int] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    base_url: str = ""

    def head_and_tail(self) -> tuple[bytes, bytes]:
        """The JSON around the text: the text itself is the filler between them."""
        if self.shape == "anthropic":
            head = (
                '{"id":"msg_1","type":"message","role":"assistant","model":"m",'
                '"content":[{"type":"text","text":"'
            )
            tail = '"}],"stop_reason":"end_turn","usage":{"input_tokens":1,"output_tokens":1}}'
        else:
            head = (
                '{"id":"c1","object":"chat.completion","model":"m",'
                '"choices":[{"index":0,"message":{"role":"assistant","content":"'
            )
            tail = '"},"finish_reason":"stop"}]}'
        return head.encode(), tail.encode()

    def bytes_sent(self, requests: int = 1, timeout: float = 30.0) -> list[int]:
        """The body bytes sent to each request, once `requests` answers have ended (the server
        stops when its client hangs up, a moment after the client has given up)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self.lock:
                if len(self.sent) >= requests:
                    return list(self.sent)
            time.sleep(0.02)
        raise AssertionError(f"{len(self.sent)} answers ended, {requests} expected")

    def body_parts(self) -> Iterator[bytes]:
        if self.error is not None:
            yield self.error
            return
        head, tail = self.head_and_tail()
        yield head
        left = self.size - len(head) - len(tail)
        filler = b"a" * CHUNK
        while left > 0:
            yield filler[: min(CHUNK, left)]
            left -= CHUNK
        yield tail


def _handler(answers: HostileModel) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("content-length") or 0))
            sent = 0
            try:
                self.send_response(answers.status)
                self.send_header("content-type", "application/json")
                if answers.error is not None:
                    self.send_header("content-length", str(len(answers.error)))
                elif answers.declared:
                    self.send_header("content-length", str(answers.size))
                else:
                    self.send_header("transfer-encoding", "chunked")
                self.end_headers()
                chunked = answers.error is None and not answers.declared
                for part in answers.body_parts():
                    if chunked:
                        self.wfile.write(b"%x\r\n%s\r\n" % (len(part), part))
                    else:
                        self.wfile.write(part)
                    sent += len(part)
                if chunked:
                    self.wfile.write(b"0\r\n\r\n")
                self.wfile.flush()
            except (BrokenPipeError, ConnectionResetError):
                pass  # the client stopped reading and hung up: what was sent is counted
            finally:
                self.close_connection = True
                with answers.lock:
                    answers.sent.append(sent)

        def log_message(self, *args: Any) -> None:
            pass

    return Handler


@contextlib.contextmanager
def hostile_model(size: int = 0, **options: Any) -> Iterator[HostileModel]:
    """A server answering `size`-byte bodies, or an `error` (see `HostileModel`)."""
    answers = HostileModel(size, **options)
    with serving(_handler(answers)) as url:
        answers.base_url = url
        yield answers


def error_body(prompt: str, key: str) -> bytes:
    """A provider's error body that echoes the user's prompt and a key-shaped string, in its
    message and in the fields that usually hold a code (the probe's body)."""
    return json.dumps(
        {
            "error": {
                "message": f"Request rejected: {prompt!r} used key {key}",
                "type": "invalid_request_error",
                "code": key,
                "param": prompt,
            }
        }
    ).encode()
