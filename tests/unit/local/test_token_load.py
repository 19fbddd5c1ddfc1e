"""The token-limit trials' arithmetic and the simulator's tokenizer: what a provider allowed
over a span (its bucket, then its refill), whole minutes past the first, and tokens counted
as a word or a run of punctuation each, 3 a message, 3 the reply."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from liyagent.local.token_load import allowance, minute_windows
from simulators.token_limit import completion_tokens, count, prompt_tokens

T0 = datetime(2026, 1, 1, tzinfo=UTC)


@dataclass(frozen=True)
class Sent:
    status: int
    prompt_tokens: int | None
    created_at: datetime


def test_the_allowance_is_the_bucket_then_its_refill_over_the_span() -> None:
    sent = [
        Sent(200, 100, T0),
        Sent(429, None, T0 + timedelta(seconds=10)),
        Sent(200, 50, T0 + timedelta(seconds=30)),
    ]
    answered, allowed, span = allowance(sent, 600)
    assert (answered, allowed, span) == (150, 600 + 300, 30.0)


def test_whole_minutes_past_the_first_are_each_a_share_of_the_limit() -> None:
    sent = [
        Sent(200, 1000, T0),
        Sent(200, 30, T0 + timedelta(seconds=61)),
        Sent(200, 30, T0 + timedelta(seconds=119)),
        Sent(429, None, T0 + timedelta(seconds=100)),
        Sent(200, 60, T0 + timedelta(seconds=150)),
    ]
    # The span is 150 s: one whole minute past the first (60-120 s); 150-180 s is not whole.
    assert minute_windows(sent, 60) == [1.0]


def test_the_simulators_tokenizer_counts_words_and_runs_of_punctuation() -> None:
    assert count("Three words here.") == 4
    assert count('{"ticket": "T-1"}') == 8  # {" ticket ": " T - 1 "}
    assert count(None) == 0
    assert prompt_tokens([{"role": "user", "content": "hi"}]) == 3 + 3 + 1
    call = {"function": {"name": "ticket__read", "arguments": '{"ticket": "T-1"}'}}
    assert completion_tokens({"content": None, "tool_calls": [call]}) == 3 + 1 + 8
