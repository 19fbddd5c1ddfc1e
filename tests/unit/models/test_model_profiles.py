"""Model endpoints and keys are the deployment's: a run names a profile the deployment declares
(or a provider and base URL one declares), and a key comes only from where that profile says,
never from one of liyagent's own settings. Every refusal names the field and never repeats
what the caller sent."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from runtime.base.settings import ConfigError
from runtime.models.base import ModelError
from runtime.models.profiles import BUILT_IN, parse
from runtime.models.specs import AnthropicSpec, ModelSpecError, OpenAISpec, check

ATTACKER = "http://attacker.example/v1"
DECLARED = parse(
    json.dumps(
        {
            "local": {
                "provider": "openai",
                "base_url": "http://127.0.0.1:9999/v1/",
                "api_key_env": "LOCAL_MODEL_KEY",
                "model": "llama-3",
                "max_tokens": 512,
            }
        }
    )
)


def _refused(spec: dict[str, Any], says: str, hidden: str = "") -> str:
    with pytest.raises(ModelSpecError) as info:
        check(spec, DECLARED)
    message = str(info.value)
    assert says in message, message
    assert not info.value.retryable
    if hidden:
        assert hidden not in message
    return message


@pytest.mark.parametrize(
    "secret_env",
    ["LIYAGENT_TEAMS_APP_PASSWORD", "LIYAGENT_SEAL_KEYS", "LIYAGENT_DATABASE_URL", "HOME"],
)
def test_the_probes_spec_cannot_point_a_worker_secret_anywhere(secret_env: str) -> None:
    # The probe: an endpoint of the caller's own, and a worker variable as its "key".
    _refused(
        {"provider": "openai", "model": "m", "base_url": ATTACKER, "api_key_env": secret_env},
        "model.base_url: not a model endpoint this deployment declares",
        hidden="attacker.example",
    )
    # The provider's own endpoint, with any variable but the one its profile lists.
    _refused(
        {"provider": "openai", "model": "m", "api_key_env": secret_env},
        "model.api_key_env: not the variable this deployment lists",
    )
    _refused(
        {"profile": "local", "api_key_env": secret_env},
        "model.api_key_env: not the variable this deployment lists",
    )


def test_a_profile_is_named_by_name_or_by_its_endpoint() -> None:
    by_name = check({"profile": "local"}, DECLARED)
    assert isinstance(by_name, OpenAISpec)
    endpoint = by_name.endpoint(DECLARED)
    assert (
        endpoint.base_url == "http://127.0.0.1:9999/v1" and endpoint.key_source == "LOCAL_MODEL_KEY"
    )
    assert by_name.model_name(endpoint) == "llama-3"
    by_url = check(
        {"provider": "openai", "model": "m", "base_url": "http://127.0.0.1:9999/v1"}, DECLARED
    )
    assert isinstance(by_url, OpenAISpec)
    assert by_url.endpoint(DECLARED) is endpoint
    # The built-in profiles: each provider's public endpoint and its usual variable.
    plain = check({"provider": "anthropic", "model": "claude-sonnet-4-6"}, DECLARED)
    assert isinstance(plain, AnthropicSpec)
    assert plain.endpoint(DECLARED).key_source == "ANTHROPIC_API_KEY"


@pytest.mark.parametrize(
    ("spec", "says"),
    [
        ({"profile": "nope"}, "model.profile is not a profile this deployment declares"),
        ({"provider": "anthropic", "profile": "local"}, "is not a anthropic profile"),
        ({"profile": "local", "base_url": ATTACKER}, "a run cannot move a profile"),
        ({"provider": "openai"}, "model.model: name the model"),
        ({"profile": "local", "max_tokens": 513}, "more than its profile allows (512)"),
    ],
)
def test_what_a_profile_does_not_allow_is_refused(spec: dict[str, Any], says: str) -> None:
    message = _refused(spec, says)
    assert "attacker.example" not in message


@pytest.mark.parametrize(
    ("url", "hidden"),
    [
        ("https://user:hunter2@api.openai.com/v1", "hunter2"),
        ("https://api.openai.com/v1?api-key=abc123secret", "abc123secret"),
        ("https://api.openai.com/v1#key=abc123secret", "abc123secret"),
    ],
)
def test_credentials_in_a_url_are_refused_and_never_repeated(url: str, hidden: str) -> None:
    _refused({"provider": "openai", "model": "m", "base_url": url}, "base_url: Value error", hidden)
    with pytest.raises(ConfigError) as info:
        parse(json.dumps({"p": {"provider": "openai", "base_url": url, "api_key_env": "K"}}))
    assert "credentials never go in a URL" in str(info.value) and hidden not in str(info.value)


@pytest.mark.parametrize(
    ("profile", "says"),
    [
        ({"api_key_env": "LIYAGENT_SEAL_KEYS"}, "one of liyagent's own settings"),
        ({"api_key_env": "ticketiq_thing"}, "one of liyagent's own settings"),
        ({}, "name exactly one of api_key_env and api_key_file"),
        ({"api_key_env": "K", "api_key_file": "/k"}, "name exactly one of"),
        ({"api_key_file": "relative/key"}, "must be an absolute path"),
        ({"api_key_env": "K", "limit": 1}, "Extra inputs are not permitted"),
        ({"api_key_env": "K", "limits": {"rpm": 1}}, "p.limits.rpm: Extra inputs"),
        (
            {"api_key_env": "K", "limits": {"requests_per_minute": 0}},
            "p.limits.requests_per_minute",
        ),
        (
            {"api_key_env": "K", "limits": {"input_tokens_per_minute": -5}},
            "input_tokens_per_minute",
        ),
        ({"api_key_env": "K", "limits": {"output_tokens_per_minute": 0}}, "output_tokens_per_min"),
        ({"api_key_env": "K", "limits": {"in_flight": 0}}, "p.limits.in_flight"),
        ({"api_key_env": "K", "limits": {"in_flight": 2.5}}, "p.limits.in_flight"),
        ({"api_key_env": "K", "limits": {"in_flight": "3"}}, "p.limits.in_flight"),
    ],
)
def test_a_bad_profile_refuses_the_setting(profile: dict[str, Any], says: str) -> None:
    declared = {"provider": "openai", "base_url": "https://api.openai.com/v1", **profile}
    with pytest.raises(ConfigError) as info:
        parse(json.dumps({"p": declared}))
    assert says in str(info.value) and "LIYAGENT_MODEL_PROFILES" in str(info.value)


def test_a_key_comes_from_its_profiles_variable_or_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    key_file = tmp_path / "model-key"
    key_file.write_text("k-from-file\n")
    raw = {
        "env": {"provider": "openai", "base_url": "http://h/v1", "api_key_env": "MODEL_K"},
        "file": {"provider": "openai", "base_url": "http://g/v1", "api_key_file": str(key_file)},
    }
    declared = parse(json.dumps(raw))
    monkeypatch.setenv("MODEL_K", "k-from-env")
    assert declared["env"].key() == "k-from-env" and declared["file"].key() == "k-from-file"
    monkeypatch.delenv("MODEL_K")
    with pytest.raises(ModelError, match=r"MODEL_K \(api_key_env\) is not set"):
        declared["env"].key()
    # The setting may also name a file holding the JSON.
    profiles_file = tmp_path / "profiles.json"
    profiles_file.write_text(json.dumps(raw))
    assert parse(f"@{profiles_file}")["file"].base_url == "http://g/v1"


def test_the_built_in_profiles_stand_alone() -> None:
    assert parse("") == BUILT_IN
    assert set(
        parse(
            json.dumps(
                {"openai": {"provider": "openai", "base_url": "http://x/v1", "api_key_env": "K"}}
            )
        )
    ) == {"openai", "anthropic"}
