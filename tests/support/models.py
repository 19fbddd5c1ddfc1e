"""Model providers built as a worker builds them: a spec checked, and the deployment's profile
(endpoint and key source) it resolves to."""

from __future__ import annotations

from typing import Any

from runtime.models.anthropic import AnthropicProvider
from runtime.models.openai import OpenAIProvider
from runtime.models.profiles import ModelProfile
from runtime.models.specs import AnthropicSpec, OpenAISpec


def openai_at(base_url: str, key_env: str, **spec: Any) -> OpenAIProvider:
    """The OpenAI-compatible provider of a profile at `base_url` whose key is in `key_env`."""
    endpoint = ModelProfile(provider="openai", base_url=base_url, api_key_env=key_env)
    return OpenAIProvider(OpenAISpec.parse({"model": "gpt-test", **spec}), endpoint)


def anthropic_at(base_url: str, key_env: str, **spec: Any) -> AnthropicProvider:
    """The Anthropic provider of a profile at `base_url` whose key is in `key_env`."""
    endpoint = ModelProfile(provider="anthropic", base_url=base_url, api_key_env=key_env)
    return AnthropicProvider(AnthropicSpec.parse(spec), endpoint)
