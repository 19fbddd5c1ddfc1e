"""A run's model spec, checked before the run is stored: a known provider, exactly that
provider's fields (one pydantic model per provider), and never a secret.

A spec is stored with its run (`runs.spec`) and read by every worker that takes the run up, so
it names where a key is (`api_key_env`, a variable of the worker's environment), never the key.
A spec that carries anything that looks like one (`api_key`, `token`, `sk-...`) is refused with
a message that names the field and never repeats its value, so no error, log line or audit row
holds it either.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Annotated, Any, ClassVar, Literal, Self

import pydantic

from runtime.base.validation import described
from runtime.models.base import ModelError
from runtime.models.scripted import ScriptError, validate_script

DEFAULT_PROVIDER = "scripted"
OPENAI_BASE_URL = "https://api.openai.com/v1"
ANTHROPIC_BASE_URL = "https://api.anthropic.com"
# An environment variable's name: a key pasted into `api_key_env` does not fit it.
EnvName = Annotated[str, pydantic.StringConstraints(pattern=r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")]
# Field names that hold a secret (compared lower-cased, '-' as '_'), and their endings.
SECRET_FIELDS = frozenset(
    {"key", "apikey", "secret", "token", "password", "passwd", "authorization", "bearer"}
    | {"api_token", "auth_token", "access_token", "bearer_token", "session_token"}
    | {"credential", "credentials", "headers", "default_headers", "extra_headers"}
)
# Not "_token": `max_token` is a misspelled `max_tokens`, refused as an unknown key instead.
SECRET_ENDINGS = ("_key", "_secret", "_password", "_credentials")
# Values that are a provider key or an Authorization header, wherever they are put.
SECRET_VALUE = re.compile(r"^\s*(sk-|sk_|Bearer\s|Basic\s)", re.IGNORECASE)
USE_ENV = (
    "put the key in an environment variable of the workers and name that variable in "
    'api_key_env (e.g. "api_key_env": "OPENAI_API_KEY")'
)


class ModelSpecError(ModelError):
    """The spec cannot be used; the message names the field and what to do, never a value."""

    def __init__(self, message: str) -> None:
        super().__init__(message, retryable=False)


class ProviderSpec(pydantic.BaseModel):
    """The fields one provider takes; unknown ones are refused."""

    model_config = pydantic.ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)
    provider_name: ClassVar[str]

    @classmethod
    def parse(cls, spec: Mapping[str, Any]) -> Self:
        """The checked spec, or ModelSpecError naming each problem and the known fields."""
        try:
            return cls.model_validate(dict(spec))
        except pydantic.ValidationError as exc:
            raise ModelSpecError(
                f"{cls.provider_name} model spec: {described(exc, '(spec)')}; known keys: "
                f"{sorted(cls.model_fields)} (the API key is never put in the spec: name its "
                "variable in api_key_env)"
            ) from None


class ScriptedSpec(ProviderSpec):
    """The embedded scripted model: it plays `script`, one entry per step."""

    provider_name: ClassVar[str] = "scripted"
    provider: Literal["scripted"] = "scripted"
    script: dict[str, Any]

    @pydantic.field_validator("script")
    @classmethod
    def _playable(cls, script: dict[str, Any]) -> dict[str, Any]:
        try:
            validate_script(script)
        except ScriptError as exc:
            raise ValueError(str(exc)) from None
        return script


class OpenAISpec(ProviderSpec):
    """An OpenAI-compatible chat-completions endpoint."""

    provider_name: ClassVar[str] = "openai"
    model_config = pydantic.ConfigDict(str_strip_whitespace=True)
    provider: Literal["openai"] = "openai"
    model: str = pydantic.Field(min_length=1)
    base_url: str = pydantic.Field(default=OPENAI_BASE_URL, pattern=r"^https?://")
    # When set, the endpoint is read from this variable at call time (like the key), so one
    # catalog serves deployments whose model endpoints differ.
    base_url_env: EnvName | None = None
    api_key_env: EnvName = "OPENAI_API_KEY"
    # Strict: a number (an integer too), never true/false or text.
    temperature: pydantic.StrictFloat | None = pydantic.Field(default=None, ge=0, le=2)
    max_tokens: pydantic.StrictInt | None = pydantic.Field(default=None, ge=1)
    timeout_s: pydantic.StrictFloat = pydantic.Field(default=30.0, gt=0)

    @pydantic.field_validator("base_url")
    @classmethod
    def _no_trailing_slash(cls, url: str) -> str:
        return url.rstrip("/")


class AnthropicSpec(ProviderSpec):
    """The Anthropic Messages API."""

    provider_name: ClassVar[str] = "anthropic"
    provider: Literal["anthropic"] = "anthropic"
    model: str = pydantic.Field(min_length=1)
    api_key_env: EnvName = "ANTHROPIC_API_KEY"
    base_url: str = pydantic.Field(default=ANTHROPIC_BASE_URL, pattern=r"^https?://")
    # When set, the endpoint is read from this environment variable at call time.
    base_url_env: EnvName | None = None
    # Required by the API: the most tokens one step may generate.
    max_tokens: pydantic.StrictInt = pydantic.Field(default=1024, ge=1)
    temperature: float | None = pydantic.Field(default=None, ge=0, le=1)
    timeout_s: float = pydantic.Field(default=60.0, gt=0)


class FrameworkSpec(ProviderSpec):
    """A framework's agent (Pydantic AI, OpenAI Agents SDK) registered in the workers' tool
    modules: it answers each step with its own model (`runtime/toolbox/guests.py`). The spec
    only names it, so it holds no code and no secret: its model, endpoint and key are the
    agent's own, in the worker's code and environment."""

    provider_name: ClassVar[str] = "framework"
    provider: Literal["framework"] = "framework"
    # Which adapter registered it ("pydantic-ai", "openai-agents"), for messages and checks.
    framework: str = pydantic.Field(pattern=r"^[a-z][a-z0-9-]{0,39}$")
    # The name it was registered under (`durable(agent, name=...)`).
    agent: str = pydantic.Field(pattern=r"^[A-Za-z0-9._-]{1,200}$")


PROVIDERS: dict[str, type[ProviderSpec]] = {
    s.provider_name: s for s in (ScriptedSpec, OpenAISpec, AnthropicSpec, FrameworkSpec)
}


def _secret_field(name: str) -> bool:
    plain = name.lower().replace("-", "_")
    return plain in SECRET_FIELDS or plain.endswith(SECRET_ENDINGS)


def refuse_secrets(spec: Mapping[str, Any]) -> None:
    """ModelSpecError if the spec carries a secret: a field named like one, or a value that
    is a key or an Authorization header. The message names the field, never its value."""
    for name, value in spec.items():
        if _secret_field(str(name)):
            raise ModelSpecError(
                f"model.{name}: a secret is never put in a run's model spec (it would be "
                f"stored with the run); {USE_ENV}"
            )
        if isinstance(value, str) and SECRET_VALUE.match(value):
            raise ModelSpecError(
                f"model.{name}: its value looks like an API key or an Authorization header, "
                f"and a secret is never put in a run's model spec; {USE_ENV}"
            )


def check(spec: Any) -> ProviderSpec:
    """The spec checked for its provider (`scripted` when none is named): ModelSpecError
    naming the field, the known providers or what to do otherwise."""
    if not isinstance(spec, Mapping):
        raise ModelSpecError(
            f"model must be an object with a provider ({', '.join(sorted(PROVIDERS))})"
        )
    refuse_secrets(spec)
    provider = spec.get("provider", DEFAULT_PROVIDER)
    found = PROVIDERS.get(provider) if isinstance(provider, str) else None
    if found is None:
        shown = repr(provider)[:40]
        raise ModelSpecError(
            f"model.provider {shown} is not a known provider; known: {', '.join(sorted(PROVIDERS))}"
        )
    return found.parse(spec)
