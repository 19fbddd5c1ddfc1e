"""Load at twice a model endpoint's tokens a minute, for the token-limit trials and the bench's
flowctl section, and the throughput the model server's own records show against what a
provider's limit allowed."""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from runtime.entries.client import Client


def allowance(sent: Sequence[Any], limit: int) -> tuple[int, float, float]:
    """Input tokens answered (status 200), what a bucket of `limit` a minute allowed from the
    first request to the last (full at first, then its refill), and that span in seconds."""
    answered = sum(r.prompt_tokens or 0 for r in sent if r.status == 200)
    span = (sent[-1].created_at - sent[0].created_at).total_seconds()
    return answered, limit + limit * span / 60, span


def minute_windows(sent: Sequence[Any], limit: int) -> list[float]:
    """Each whole minute past the first (the provider's full bucket is spent in it): the
    input tokens answered in it, as a share of `limit`."""
    first, last = sent[0].created_at, sent[-1].created_at
    shares = []
    k = 1
    while 60 * (k + 1) <= (last - first).total_seconds():
        start, end = 60 * k, 60 * (k + 1)
        tokens = sum(
            r.prompt_tokens or 0
            for r in sent
            if r.status == 200 and start <= (r.created_at - first).total_seconds() < end
        )
        shares.append(tokens / limit)
        k += 1
    return shares


@dataclass
class Load:
    """Runs offered to a model endpoint from a thread: a bucket's worth at once (what a minute
    of idleness leaves), then twice `limit` input tokens a minute, until stopped; `per_run`
    is one run's input tokens as the model server counts them."""

    client: Client
    model: dict[str, Any]
    limit: int
    per_run: int
    runs: list[str] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)

    def start_one(self, tag: str) -> str:
        """Start one run of the load (`tag` ends its input, so no two are the same)."""
        run = self.client.start_run(
            agent="load", model=self.model, user_input=PROSE * 4 + tag, tools=["ticket.read"]
        )
        self.runs.append(run)
        return run

    def offer(self) -> threading.Thread:
        """Offer the load from a thread of its own until `stop` is set; join it after."""
        thread = threading.Thread(target=self._offer, name="token-load", daemon=True)
        thread.start()
        return thread

    def _offer(self) -> None:
        for i in range(math.ceil(self.limit / self.per_run)):
            self.start_one(f"burst {i}")
        every_s = self.per_run / (2 * self.limit / 60)
        began, i = time.monotonic(), 0
        while not self.stop.wait(max(0.0, began + i * every_s - time.monotonic())):
            self.start_one(f"offered {i}")
            i += 1


# A request as an English-speaking user writes it (about 60 tokens; 4 make a step's input).
PROSE = (
    "Our checkout service returns intermittent errors after the last deploy, mostly for "
    "customers paying by card in the afternoon. Please read the ticket, compare it with the "
    "incident from last week, and tell me whether the rollback we discussed is still needed. "
)
# A run of the load: a read, then an answer.
SCRIPT = [
    {
        "calls": [{"id": "toolu_r", "tool": "ticket.read", "args": {"ticket": "T-1"}}],
        "latency_ms": 100,
    },
    {"final": "Read; no rollback needed.", "latency_ms": 100},
]
