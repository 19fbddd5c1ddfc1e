"""The price table: built-in list prices, a deployment's own over them, a dated release priced as
the model it extends, an unpriced model said to be unknown, and a bad table refused at start
with the model and field named."""

from __future__ import annotations

from decimal import Decimal

import pytest

from runtime.base.config import ConfigError
from runtime.base.settings import Settings
from runtime.models import prices
from runtime.ops.startup import StartupRefused, check


def test_a_responses_cost_is_its_tokens_at_the_models_prices() -> None:
    table = prices.parse(prices.as_setting({"m": {"input": 2, "output": 8, "cached_input": 0.5}}))
    # 1,000 input tokens of which 400 cached, 100 output: (600*2 + 400*0.5 + 100*8) / 1e6.
    assert table.cost_usd("m", 1000, 100, 400) == Decimal("0.002200000")
    # No cached price: cached tokens cost the input price.
    plain = prices.parse(prices.as_setting({"m": {"input": 2, "output": 8}}))
    assert plain.cost_usd("m", 1000, 100, 400) == Decimal("0.002800000")


def test_built_in_prices_and_dated_releases() -> None:
    table = prices.parse("")
    assert table.cost_usd("gpt-4o", 1_000_000, 0) == Decimal("2.500000000")
    assert table.price_of("gpt-4o-2024-08-06") == table.price_of("gpt-4o")
    # The longest priced name it extends: gpt-4o-mini's own, not gpt-4o's.
    assert table.price_of("gpt-4o-mini-2024-07-18") == table.price_of("gpt-4o-mini")
    assert table.price_of("gpt-4o-mini") != table.price_of("gpt-4o")
    assert table.cost_usd("my-own-model", 10, 10) is None
    assert table.cost_usd(None, 10, 10) is None
    # Not a release of it: a name that merely starts the same.
    assert table.price_of("gpt-4omega") is None


def test_a_deployments_price_replaces_the_built_in_one() -> None:
    table = prices.parse(prices.as_setting({"gpt-4o": {"input": 1, "output": 1}}))
    assert table.cost_usd("gpt-4o", 1_000_000, 1_000_000) == Decimal("2.000000000")
    assert table.price_of("o3") == prices.BUILT_IN["o3"]


@pytest.mark.parametrize(
    ("raw", "named"),
    [
        ('{"m": {"input": 1}}', "m.output"),
        ('{"m": {"input": -1, "output": 1}}', "m.input"),
        ('{"m": {"input": "cheap", "output": 1}}', "m.input"),
        ('{"m": {"input": 1, "output": 1, "currency": "EUR"}}', "m.currency"),
        ('{"m": 3}', "m"),
        ("[1]", "(prices)"),
        ("{not json", "(prices)"),
    ],
)
def test_a_bad_table_is_refused_naming_the_model_and_field(raw: str, named: str) -> None:
    with pytest.raises(ConfigError) as refused:
        prices.parse(raw)
    assert str(refused.value).startswith(f"{prices.SETTING}: ")
    assert named in str(refused.value)
    with pytest.raises(StartupRefused) as at_start:
        check(Settings(model_prices=raw))
    assert prices.SETTING in str(at_start.value)


def test_a_table_from_a_file(tmp_path) -> None:
    path = tmp_path / "prices.json"
    path.write_text('{"house": {"input": 1, "output": 3}}')
    assert prices.parse(f"@{path}").cost_usd("house", 1_000_000, 0) == Decimal("1.000000000")
    with pytest.raises(ConfigError, match="cannot read"):
        prices.parse(f"@{tmp_path / 'missing.json'}")
