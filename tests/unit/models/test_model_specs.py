"""A run's model spec is checked before it is stored: a known provider, its own fields, and no
secret; every refusal names the field and what to do, and never repeats a secret's value."""

from __future__ import annotations

from typing import Any

import pytest

from runtime.models.profiles import BUILT_IN
from runtime.models.specs import (
    AnthropicSpec,
    ModelSpecError,
    OpenAISpec,
    ScriptedSpec,
    check,
)

KEY = "sk-proj-abcdefghijklmnop0123456789"
# A key that fits a variable's name: refused because it is not the profile's variable.
AWS = "AKIAQWERTYUIOPASDFGH"


@pytest.mark.parametrize(
    ("spec", "kind"),
    [
        ({"script": {"steps": [{"final": "ok"}]}}, ScriptedSpec),
        ({"provider": "openai", "model": "gpt-4o-mini", "temperature": 0}, OpenAISpec),
        ({"provider": "anthropic", "model": "claude-sonnet-4-6", "max_tokens": 64}, AnthropicSpec),
    ],
)
def test_a_good_spec_is_read_for_its_provider(spec: dict[str, Any], kind: type) -> None:
    assert isinstance(check(spec, BUILT_IN), kind)


@pytest.mark.parametrize(
    ("spec", "says"),
    [
        ({"provider": "openai", "model": "m", "api_key": KEY}, "model.api_key: a secret"),
        ({"provider": "openai", "model": "m", "API-Key": KEY}, "model.API-Key: a secret"),
        ({"provider": "anthropic", "model": "m", "auth_token": KEY}, "model.auth_token"),
        ({"provider": "openai", "model": "m", "api_key_env": KEY}, "model.api_key_env: its value"),
        ({"provider": "openai", "model": "m", "api_key_env": AWS}, "model.api_key_env: not the"),
        ({"provider": "openai", "model": KEY}, "model.model: its value looks like an API key"),
        ({"provider": "openai", "model": "m", "base_url": f"Bearer {KEY}"}, "model.base_url"),
    ],
)
def test_an_inline_secret_is_refused_without_repeating_it(spec: dict[str, Any], says: str) -> None:
    with pytest.raises(ModelSpecError) as info:
        check(spec, BUILT_IN)
    message = str(info.value)
    # Says where a key goes instead: the deployment's profiles.
    assert says in message and ("LIYAGENT_MODEL_PROFILES" in message or "profile" in message)
    assert KEY not in message and AWS not in message
    assert not info.value.retryable


@pytest.mark.parametrize(
    ("spec", "says"),
    [
        ({"provider": "opnai", "model": "m"}, "model.provider 'opnai' is not a known provider"),
        ({"provider": 7}, "known: anthropic, framework, openai, scripted"),
        ("gpt-4o", "model must be an object with a provider"),
        ({"provider": "openai", "model": "m", "max_token": 5}, "max_token: Extra inputs"),
        ({"provider": "openai", "model": "m", "api_key_env": "1BAD"}, "api_key_env: String"),
        ({"provider": "openai", "model": "m", "timeout_s": True}, "timeout_s: Input should"),
        ({"provider": "anthropic", "model": "m", "temperature": 3}, "temperature: Input should"),
        ({"provider": "scripted", "script": {"steps": []}}, "a script needs at least one step"),
        ({"script": {"steps": [{"final": "x"}]}, "latency": 1}, "latency: Extra inputs"),
    ],
)
def test_a_bad_spec_names_the_field_and_the_known_ones(spec: Any, says: str) -> None:
    with pytest.raises(ModelSpecError) as info:
        check(spec, BUILT_IN)
    assert says in str(info.value)


def test_known_keys_are_listed_for_the_provider() -> None:
    with pytest.raises(ModelSpecError) as info:
        check({"provider": "openai", "model": "m", "frequency": 1}, BUILT_IN)
    assert "known keys: ['api_key_env', 'base_url', 'max_tokens', 'model'" in str(info.value)
