"""The reservation a step notes before it is asked (runtime/core/ledger.py) bounds what the
model server bills: its input bound is never under the simulator's own count of the prompt
(simulators/token_limit.py `prompt_tokens`), whatever the messages hold; its output bound is the
max_tokens sent; and a step's cost is priced from the deployment's table."""

from __future__ import annotations

import random
import string
from decimal import Decimal

from runtime.base.settings import Settings
from runtime.core.ledger import input_bound, output_bound, stored
from runtime.flow.limits import DEFAULT_OUTPUT_TOKENS
from runtime.models import prices
from runtime.models.base import Usage
from runtime.models.profiles import ModelProfile
from simulators.token_limit import prompt_tokens

_ALPHABET = string.ascii_letters + string.punctuation + " \n\t" + "éß漢字🙂"


def _text(rng: random.Random) -> str:
    return "".join(rng.choice(_ALPHABET) for _ in range(rng.randint(0, 200)))


def _message(rng: random.Random) -> dict[str, object]:
    message: dict[str, object] = {"role": rng.choice(["user", "assistant", "tool"])}
    message["content"] = _text(rng) if rng.random() < 0.9 else None
    if rng.random() < 0.3:
        message["tool_calls"] = [
            {"id": f"c{i}", "type": "function",
             "function": {"name": _text(rng)[:20] or "f", "arguments": _text(rng)}}
            for i in range(rng.randint(1, 3))
        ]  # fmt: skip
    if rng.random() < 0.2:
        message["name"] = _text(rng)[:30]
    return message


def test_the_input_bound_covers_the_simulators_count_of_any_prompt() -> None:
    rng = random.Random(34)
    for _ in range(500):
        messages = [_message(rng) for _ in range(rng.randint(0, 12))]
        assert input_bound(messages, []) >= prompt_tokens(messages)


def test_a_dense_prompt_is_still_covered() -> None:
    """Every character a token (marks and words alternating): the densest the count gets."""
    messages = [{"role": "user", "content": "a." * 5_000}, {"role": "user", "content": ""}]
    assert input_bound(messages, []) >= prompt_tokens(messages)


def test_the_output_bound_is_the_max_tokens_sent() -> None:
    base = {"provider": "openai", "base_url": "https://api.example.com/v1", "api_key_env": "K"}
    capped = ModelProfile.model_validate({**base, "max_tokens": 300})
    assert output_bound({"max_tokens": 50}, capped) == 50
    assert output_bound({}, capped) == 300
    assert output_bound({}, None) == DEFAULT_OUTPUT_TOKENS


def test_a_step_is_priced_with_the_deployments_table_unless_the_ledger_is_off() -> None:
    table = prices.as_setting({"m": {"input": 2, "output": 10}})
    priced = stored(Usage(1_000, 100, 0, "m-2026"), Settings(model_prices=table))
    assert priced is not None and priced.cost_usd == Decimal("0.003")
    unknown = stored(Usage(1_000, 100, 0, "other"), Settings(model_prices=table))
    assert unknown is not None and unknown.cost_usd is None and unknown.input_tokens == 1_000
    off = stored(Usage(1_000, 100), Settings(model_prices=table, usage_ledger=False))
    assert off is not None and off.cost_usd is None and off.output_tokens == 100
