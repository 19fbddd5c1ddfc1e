"""Reading a Server-Sent Events stream as a client does: each message's id and data, the
heartbeat comments, and the time each message arrived."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx


@dataclass
class Received:
    """What one stream delivered: messages (id, data, arrival on the wall clock), comments."""

    status: int = 0
    messages: list[tuple[str | None, dict[str, Any], float]] = field(default_factory=list)
    comments: list[str] = field(default_factory=list)
    ended: bool = False  # the server closed the stream
    broke: str | None = None  # the connection broke (the front went away)
    opened: threading.Event = field(default_factory=threading.Event)

    @property
    def seqs(self) -> list[int]:
        return [int(m[1]["seq"]) for m in self.messages]

    @property
    def kinds(self) -> list[str]:
        return [str(m[1]["kind"]) for m in self.messages]


def read(
    url: str,
    headers: dict[str, str],
    into: Received,
    until: Callable[[Received], bool] = lambda r: False,
    timeout_s: float = 60.0,
) -> Received:
    """Read `url` as SSE into `into` until the server closes it, the connection breaks, or
    `until(into)` holds after a message."""
    try:
        with httpx.stream(
            "GET", url, headers=headers, timeout=httpx.Timeout(timeout_s, connect=5)
        ) as r:
            into.status = r.status_code
            into.opened.set()
            if r.status_code != 200:
                r.read()
                return into
            sid: str | None = None
            data: list[str] = []
            for line in r.iter_lines():
                if line.startswith(":"):
                    into.comments.append(line)
                elif line.startswith("id:"):
                    sid = line[3:].strip()
                elif line.startswith("data:"):
                    data.append(line[5:].strip())
                elif line == "" and data:
                    into.messages.append((sid, json.loads("\n".join(data)), time.time()))
                    sid, data = None, []
                    if until(into):
                        return into
            into.ended = True
    except (httpx.TransportError, httpx.StreamError) as exc:
        into.broke = type(exc).__name__
    finally:
        into.opened.set()
    return into


def reader(url: str, headers: dict[str, str], **kwargs: Any) -> tuple[Received, threading.Thread]:
    """`read` in a daemon thread; the Received fills as messages come."""
    got = Received()
    t = threading.Thread(target=read, args=(url, headers, got), kwargs=kwargs, daemon=True)
    t.start()
    return got, t
