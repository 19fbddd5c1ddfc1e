"""A response's usage is read into the step's answer (what corrects the endpoint's token
estimates, runtime/flow/limits.py): OpenAI's prompt/completion tokens, Anthropic's
input/output tokens, with the cached part and the model named (the step's ledger, store/usage.py);
none, or not whole numbers, reads as none (the estimates then stand)."""

from __future__ import annotations

from typing import Any

import pytest

from runtime.models import anthropic, openai
from runtime.models.base import Usage

CHOICE = {"choices": [{"message": {"role": "assistant", "content": "hi"}}]}
CONTENT = {"content": [{"type": "text", "text": "hi"}], "stop_reason": "end_turn"}


def test_openai_usage_is_read() -> None:
    payload = {**CHOICE, "usage": {"prompt_tokens": 120, "completion_tokens": 7}}
    assert openai.parse_answer("r", payload).usage == Usage(120, 7)


def test_anthropic_usage_is_read() -> None:
    payload = {**CONTENT, "usage": {"input_tokens": 50, "output_tokens": 3}}
    assert anthropic.parse_answer("r", payload).usage == Usage(50, 3)


@pytest.mark.parametrize(
    "usage",
    [None, "lots", {"prompt_tokens": "1", "completion_tokens": 2}, {"prompt_tokens": 1}],
)
def test_a_missing_or_odd_usage_reads_as_none(usage: Any) -> None:
    payload = {**CHOICE, "usage": usage}
    assert openai.parse_answer("r", payload).usage is None


def test_openai_cached_tokens_and_model_are_read() -> None:
    usage = {
        "prompt_tokens": 2000,
        "completion_tokens": 9,
        "prompt_tokens_details": {"cached_tokens": 1920},
    }
    payload = {**CHOICE, "model": "gpt-4o-2024-08-06", "usage": usage}
    assert openai.parse_answer("r", payload).usage == Usage(2000, 9, 1920, "gpt-4o-2024-08-06")


def test_anthropic_cache_reads_and_writes_count_as_input() -> None:
    # Anthropic counts the input apart from the cache's reads and writes; all are billed input.
    usage = {
        "input_tokens": 20,
        "output_tokens": 4,
        "cache_read_input_tokens": 1000,
        "cache_creation_input_tokens": 300,
    }
    payload = {**CONTENT, "model": "claude-sonnet-4-5", "usage": usage}
    assert anthropic.parse_answer("r", payload).usage == Usage(1320, 4, 1000, "claude-sonnet-4-5")


@pytest.mark.parametrize("details", [None, "x", {"cached_tokens": -1}, {"cached_tokens": True}])
def test_odd_cached_details_read_as_none_cached(details: Any) -> None:
    usage = {"prompt_tokens": 5, "completion_tokens": 1, "prompt_tokens_details": details}
    assert openai.parse_answer("r", {**CHOICE, "usage": usage}).usage == Usage(5, 1)
