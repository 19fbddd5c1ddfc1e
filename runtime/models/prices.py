"""What a model's tokens cost: the deployment's price table (issue 34), over built-in defaults.

`LIYAGENT_MODEL_PRICES` (a JSON object, or `@/path/to/prices.json`) gives each model's prices
in US dollars per million tokens:

    {"gpt-4o": {"input": 2.5, "output": 10, "cached_input": 1.25}}

`input` and `output` are required; `cached_input` (input tokens read from the prompt cache) is
the input price when left out. A declared model replaces a built-in one of the same name. A
model the response names is priced by its own name, else by the longest priced name it starts
with followed by `-` (a dated release, `gpt-4o-2024-08-06`, is priced as `gpt-4o`); a model
no entry prices costs None (its tokens are counted, its cost is said to be unknown, never 0).
Prices are a deployment's word at the time a step is written: a step keeps the cost it was
written with.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from decimal import Decimal
from functools import lru_cache
from typing import Annotated

import pydantic

from runtime.base.config import ConfigError, json_setting
from runtime.base.validation import described

SETTING = "LIYAGENT_MODEL_PRICES"
# Prices are per this many tokens.
PER = Decimal(1_000_000)
# A cost's precision as stored (Postgres numeric(18, 9)): a billionth of a dollar.
QUANTUM = Decimal("0.000000001")
ModelName = Annotated[str, pydantic.StringConstraints(min_length=1, max_length=200)]
Price = Annotated[Decimal, pydantic.Field(ge=0, le=100_000, allow_inf_nan=False)]


class ModelPrice(pydantic.BaseModel):
    """One model's prices, US dollars per million tokens."""

    model_config = pydantic.ConfigDict(extra="forbid", frozen=True)

    input: Price
    output: Price
    cached_input: Price | None = None

    def cost_usd(self, input_tokens: int, output_tokens: int, cached_tokens: int = 0) -> Decimal:
        """The cost of one response's tokens (`cached_tokens` of the input read from the
        cache, at the cached price), to a billionth of a dollar."""
        cached = min(max(cached_tokens, 0), input_tokens)
        cached_price = self.input if self.cached_input is None else self.cached_input
        raw = (input_tokens - cached) * self.input + cached * cached_price
        raw += output_tokens * self.output
        return (raw / PER).quantize(QUANTUM)


_Declared = pydantic.TypeAdapter(dict[ModelName, ModelPrice])

# Public list prices (US dollars per million tokens) of common models, as their providers
# published them in 2025; a deployment's table overrides any of them.
BUILT_IN: dict[str, ModelPrice] = {
    name: ModelPrice(input=Decimal(i), output=Decimal(o), cached_input=Decimal(c))
    for name, (i, c, o) in {
        "gpt-4o": ("2.50", "1.25", "10.00"),
        "gpt-4o-mini": ("0.15", "0.075", "0.60"),
        "gpt-4.1": ("2.00", "0.50", "8.00"),
        "gpt-4.1-mini": ("0.40", "0.10", "1.60"),
        "gpt-4.1-nano": ("0.10", "0.025", "0.40"),
        "o3": ("2.00", "0.50", "8.00"),
        "o4-mini": ("1.10", "0.275", "4.40"),
        "claude-opus-4": ("15.00", "1.50", "75.00"),
        "claude-sonnet-4": ("3.00", "0.30", "15.00"),
        "claude-3-5-haiku": ("0.80", "0.08", "4.00"),
    }.items()
}


@dataclass(frozen=True)
class PriceTable:
    """The prices a deployment charges its runs' tokens at (built-ins with its own)."""

    prices: dict[str, ModelPrice]

    def price_of(self, model: str | None) -> ModelPrice | None:
        """`model`'s prices: by its name, else by the longest priced name it extends with a
        `-` (a dated release); None when no entry prices it."""
        if not model:
            return None
        found = self.prices.get(model)
        if found is not None:
            return found
        extended = [name for name in self.prices if model.startswith(f"{name}-")]
        return self.prices[max(extended, key=len)] if extended else None

    def cost_usd(
        self, model: str | None, input_tokens: int, output_tokens: int, cached_tokens: int = 0
    ) -> Decimal | None:
        """What one response's tokens cost at `model`'s prices; None when it is unpriced."""
        price = self.price_of(model)
        if price is None:
            return None
        return price.cost_usd(input_tokens, output_tokens, cached_tokens)


@lru_cache(maxsize=16)
def parse(raw: str) -> PriceTable:
    """The built-in prices with those `LIYAGENT_MODEL_PRICES` declares; ConfigError naming the
    model and field otherwise (refused at start: nothing is priced by a table half read)."""
    text = json_setting(SETTING, raw)
    if not text:
        return PriceTable(dict(BUILT_IN))
    try:
        declared = _Declared.validate_json(text)
    except pydantic.ValidationError as exc:
        raise ConfigError(
            f"{SETTING}: {described(exc, '(prices)')}; each model is "
            '{"input": <US dollars per million input tokens>, "output": <per million output '
            'tokens>, optional "cached_input": <per million cached input tokens>} (numbers, '
            "0 or more)"
        ) from None
    return PriceTable({**BUILT_IN, **declared})


def as_setting(prices: dict[str, dict[str, float]]) -> str:
    """`LIYAGENT_MODEL_PRICES`'s value for these prices (local tooling and tests)."""
    return json.dumps(prices, separators=(",", ":"), sort_keys=True)
