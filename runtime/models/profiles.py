"""Model profiles: the model endpoints a deployment declares, and where each one's key is.

A run never chooses where a worker's key goes. It names a profile (`{"profile": "gpt"}`), or a
provider and base URL that a profile declares; the key comes only from the variable or file
that profile lists, read by the worker when it calls. `LIYAGENT_MODEL_PROFILES` (a JSON object,
or `@/path/to/profiles.json`) declares them:

    {"gpt": {"provider": "openai", "base_url": "https://api.openai.com/v1",
             "api_key_env": "OPENAI_API_KEY", "model": "gpt-4o", "max_tokens": 4096}}

Two profiles are built in, each provider's public endpoint with its usual variable: `openai`
(https://api.openai.com/v1, OPENAI_API_KEY) and `anthropic` (https://api.anthropic.com,
ANTHROPIC_API_KEY); a declared profile of the same name replaces one. A key's variable may
never be one of liyagent's own settings (`LIYAGENT_*`), so no run can send the seal keys, the
database URL or the Teams bot's password to a model endpoint.
"""

from __future__ import annotations

import json
import os
import urllib.parse
from functools import lru_cache
from pathlib import Path
from typing import Annotated, Any, Literal, Self

import pydantic

from runtime.base.config import ConfigError, json_setting
from runtime.base.validation import described
from runtime.models.base import ModelError

SETTING = "LIYAGENT_MODEL_PROFILES"
OPENAI_BASE_URL = "https://api.openai.com/v1"
ANTHROPIC_BASE_URL = "https://api.anthropic.com"
# Prefixes of the deployment's own settings: never a model key's variable.
RESERVED_PREFIXES = ("LIYAGENT_", "TICKETIQ_")
ProfileName = Annotated[str, pydantic.StringConstraints(pattern=r"^[A-Za-z0-9._-]{1,64}$")]
# An environment variable's name (a key pasted here does not fit: no '-' and at most 128).
EnvName = Annotated[str, pydantic.StringConstraints(pattern=r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")]


def url_problem(url: str) -> str | None:
    """Why `url` cannot be a model endpoint's base URL, or None: http(s) with a host, and no
    credentials in it (no user or password, no query, no fragment), since a URL is stored,
    logged and shown where a key never is."""
    try:
        parts = urllib.parse.urlsplit(url)
    except ValueError:
        return "it is not a URL"
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return "it must be an http:// or https:// URL with a host"
    if parts.username is not None or parts.password is not None:
        return "a user or password in a URL is a credential, and credentials never go in a URL"
    if parts.query or parts.fragment:
        return "a query or fragment may carry a key, and credentials never go in a URL"
    return None


def normal_url(url: str) -> str:
    """A base URL as profiles are matched: without trailing slashes."""
    return url.strip().rstrip("/")


class EndpointLimits(pydantic.BaseModel):
    """The limits the whole fleet keeps to on one endpoint (runtime/flow/limits.py): requests
    and tokens per minute, requests in flight; each optional, each at least 1."""

    model_config = pydantic.ConfigDict(extra="forbid", frozen=True)

    requests_per_minute: pydantic.StrictInt | None = pydantic.Field(default=None, ge=1)
    input_tokens_per_minute: pydantic.StrictInt | None = pydantic.Field(default=None, ge=1)
    output_tokens_per_minute: pydantic.StrictInt | None = pydantic.Field(default=None, ge=1)
    in_flight: pydantic.StrictInt | None = pydantic.Field(default=None, ge=1)

    def declared(self) -> bool:
        """Whether any limit is set (none: the endpoint costs no Redis call per request)."""
        return any(v is not None for v in self.model_dump().values())


class ModelProfile(pydantic.BaseModel):
    """One model endpoint of the deployment: its provider, base URL and key source, and what a
    run may ask of it."""

    model_config = pydantic.ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    provider: Literal["openai", "anthropic"]
    base_url: str
    # Exactly one: the worker's environment variable, or a file (a mounted secret).
    api_key_env: EnvName | None = None
    api_key_file: str | None = None
    # The model a run gets when it names none.
    model: str | None = pydantic.Field(default=None, min_length=1)
    # The most a run may ask for in one step (its spec's max_tokens above it is refused).
    max_tokens: pydantic.StrictInt | None = pydantic.Field(default=None, ge=1)
    timeout_s: pydantic.StrictFloat | None = pydantic.Field(default=None, gt=0)
    # The fleet's limits on this endpoint (none: no limiter, no Redis call per request).
    limits: EndpointLimits | None = None

    @pydantic.field_validator("base_url")
    @classmethod
    def _clean_url(cls, url: str) -> str:
        problem = url_problem(url.strip())
        if problem is not None:
            raise ValueError(problem)
        return normal_url(url)

    @pydantic.field_validator("api_key_env")
    @classmethod
    def _not_ours(cls, name: str | None) -> str | None:
        if name is not None and name.upper().startswith(RESERVED_PREFIXES):
            raise ValueError(
                f"{name} is one of liyagent's own settings; a model key comes from a variable "
                "of its own (e.g. OPENAI_API_KEY)"
            )
        return name

    @pydantic.field_validator("api_key_file")
    @classmethod
    def _absolute(cls, path: str | None) -> str | None:
        if path is not None and not Path(path).is_absolute():
            raise ValueError("must be an absolute path (e.g. /run/secrets/openai_key)")
        return path

    @pydantic.model_validator(mode="after")
    def _one_key_source(self) -> Self:
        if (self.api_key_env is None) == (self.api_key_file is None):
            raise ValueError("name exactly one of api_key_env and api_key_file")
        return self

    @property
    def key_source(self) -> str:
        """Where the key is, for messages (never the key)."""
        if self.api_key_env is not None:
            return self.api_key_env
        return f"the file {self.api_key_file}"

    def key(self) -> str:
        """The key, read now (a rotated key is used at once); ModelError when it is missing."""
        if self.api_key_env is not None:
            value = os.environ.get(self.api_key_env, "").strip()
            if not value:
                raise ModelError(
                    f"the environment variable {self.api_key_env} (api_key_env) is not set in "
                    "the worker; set it to the provider's API key and start the worker again",
                    retryable=False,
                )
            return value
        assert self.api_key_file is not None
        try:
            value = Path(self.api_key_file).read_text().strip()
        except OSError as exc:
            raise ModelError(
                f"the model key file {self.api_key_file} cannot be read ({exc.strerror}); "
                "mount it in the worker",
                retryable=False,
            ) from None
        if not value:
            raise ModelError(f"the model key file {self.api_key_file} is empty", retryable=False)
        return value


BUILT_IN: dict[str, ModelProfile] = {
    "openai": ModelProfile(
        provider="openai", base_url=OPENAI_BASE_URL, api_key_env="OPENAI_API_KEY"
    ),
    "anthropic": ModelProfile(
        provider="anthropic", base_url=ANTHROPIC_BASE_URL, api_key_env="ANTHROPIC_API_KEY"
    ),
}

_Declared = pydantic.TypeAdapter(dict[ProfileName, ModelProfile])


@lru_cache(maxsize=16)
def parse(raw: str) -> dict[str, ModelProfile]:
    """The built-in profiles with those `LIYAGENT_MODEL_PROFILES` declares; ConfigError naming
    the profile and field otherwise (never a value: a pasted key may be there)."""
    text = json_setting(SETTING, raw)
    if not text:
        return dict(BUILT_IN)
    try:
        declared = _Declared.validate_json(text)
    except pydantic.ValidationError as exc:
        raise ConfigError(
            f"{SETTING}: {described(exc, '(profiles)')}; each profile is "
            '{"provider": "openai"|"anthropic", "base_url": "https://...", "api_key_env": '
            '"VAR" or "api_key_file": "/path", optional "model", "max_tokens", "timeout_s", '
            '"limits": {"requests_per_minute", "input_tokens_per_minute", '
            '"output_tokens_per_minute", "in_flight"} (each a whole number, at least 1)}'
        ) from None
    return {**BUILT_IN, **declared}


def endpoint_for(
    profiles: dict[str, ModelProfile], provider: str, base_url: str | None
) -> tuple[str, ModelProfile] | None:
    """The profile a provider and base URL name (the provider's public URL when none), or None
    when the deployment declares no such endpoint."""
    default = OPENAI_BASE_URL if provider == "openai" else ANTHROPIC_BASE_URL
    wanted = normal_url(base_url or default)
    for name, profile in profiles.items():
        if profile.provider == provider and profile.base_url == wanted:
            return name, profile
    return None


def listed(profiles: dict[str, ModelProfile]) -> str:
    """The declared profiles for a message: name, provider and base URL (never a key)."""
    return ", ".join(f"{n} ({p.provider} {p.base_url})" for n, p in sorted(profiles.items()))


def as_setting(profiles: dict[str, dict[str, Any]]) -> str:
    """`LIYAGENT_MODEL_PROFILES`'s value for these profiles (local tooling and tests)."""
    return json.dumps(profiles, separators=(",", ":"), sort_keys=True)
