"""A run's model spec, checked before the run is stored: a known provider, exactly that
provider's fields (one pydantic model per provider), and never a secret or an endpoint of the
caller's own.

A spec is sealed into its run's definition and read by every worker that takes the run up. A
provider reached with a key is named by one of the deployment's model profiles
(`runtime/models/profiles.py`): by name, or by its provider and base URL; a worker checks it
against its own profiles again before it calls. A spec that carries anything that looks like a
secret (`api_key`, `token`, `sk-...`, a URL with a user or a query) is refused with a message
that names the field and never repeats its value, so no error, log line or audit row holds it.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any, ClassVar, Literal, Self

import pydantic

from runtime.base.validation import described
from runtime.models import profiles
from runtime.models.base import ModelError
from runtime.models.profiles import EnvName, ModelProfile, ProfileName, normal_url, url_problem
from runtime.models.scripted import ScriptError, validate_script

DEFAULT_PROVIDER = "scripted"
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
    "the deployment declares where each model key is (a model profile in "
    'LIYAGENT_MODEL_PROFILES): name the profile ("profile": "...") instead'
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
                f"{sorted(cls.model_fields)} (a key is never put in the spec: the deployment's "
                "model profile says where it is)"
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


class EndpointSpec(ProviderSpec):
    """A provider reached over HTTP with a key: the run names one of the deployment's model
    profiles (`runtime/models/profiles.py`), by name or by its provider and base URL, never a
    key or an endpoint of its own."""

    model_config = pydantic.ConfigDict(str_strip_whitespace=True)
    # The deployment's profile; without it, the profile whose provider and base URL match.
    profile: ProfileName | None = None
    # The profile's `model` when none is named.
    model: str | None = pydantic.Field(default=None, min_length=1)
    base_url: str | None = None
    # Where the profile reads its key from, if the spec names it: it must be that variable.
    api_key_env: EnvName | None = None
    timeout_s: pydantic.StrictFloat | None = pydantic.Field(default=None, gt=0)

    @pydantic.field_validator("base_url")
    @classmethod
    def _no_credentials(cls, url: str | None) -> str | None:
        if url is None:
            return None
        problem = url_problem(url)
        if problem is not None:
            raise ValueError(problem)
        return normal_url(url)

    def endpoint(self, found: dict[str, ModelProfile]) -> ModelProfile:
        """The deployment's profile this spec names, checked; ModelSpecError naming the field
        and the declared profiles otherwise (never a value the caller sent)."""
        if self.profile is not None:
            profile = found.get(self.profile)
            if profile is None or profile.provider != self.provider_name:
                raise ModelSpecError(
                    f"model.profile {self.profile!r} is not a {self.provider_name} profile this "
                    f"deployment declares ({profiles.SETTING}); declared: {profiles.listed(found)}"
                )
            if self.base_url is not None and self.base_url != profile.base_url:
                raise ModelSpecError(
                    "model.base_url: a run cannot move a profile to another endpoint; leave "
                    "base_url out when it names a profile"
                )
        else:
            match = profiles.endpoint_for(found, self.provider_name, self.base_url)
            if match is None:
                raise ModelSpecError(
                    "model.base_url: not a model endpoint this deployment declares, and a run "
                    f"may only use those ({profiles.SETTING}); declared: {profiles.listed(found)}"
                )
            profile = match[1]
        if self.api_key_env is not None and self.api_key_env != profile.api_key_env:
            raise ModelSpecError(
                "model.api_key_env: not the variable this deployment lists for that endpoint's "
                f"key ({profile.key_source}); leave api_key_env out: the profile says where "
                "its key is"
            )
        if self.model is None and profile.model is None:
            raise ModelSpecError("model.model: name the model (its profile names no default model)")
        cap = profile.max_tokens
        asked = getattr(self, "max_tokens", None)
        if cap is not None and asked is not None and asked > cap:
            raise ModelSpecError(
                f"model.max_tokens: {asked} is more than its profile allows ({cap})"
            )
        return profile

    def endpoint_name(self, found: dict[str, ModelProfile]) -> str:
        """The name of the deployment's profile this spec names (what the fleet's flow
        control is kept per: runtime/flow/); ModelSpecError as `endpoint` otherwise."""
        profile = self.endpoint(found)
        if self.profile is not None:
            return self.profile
        return next(name for name, p in found.items() if p is profile)

    def model_name(self, profile: ModelProfile) -> str:
        """The model asked for: the spec's, else its profile's default."""
        name = self.model or profile.model
        assert name is not None  # `endpoint` refused a spec with neither
        return name

    def timeout(self, profile: ModelProfile, default: float) -> float:
        """Seconds one request may take: the spec's, else its profile's, else `default`."""
        return self.timeout_s or profile.timeout_s or default


class OpenAISpec(EndpointSpec):
    """An OpenAI-compatible chat-completions endpoint."""

    provider_name: ClassVar[str] = "openai"
    provider: Literal["openai"] = "openai"
    # Strict: a number (an integer too), never true/false or text.
    temperature: pydantic.StrictFloat | None = pydantic.Field(default=None, ge=0, le=2)
    max_tokens: pydantic.StrictInt | None = pydantic.Field(default=None, ge=1)


class AnthropicSpec(EndpointSpec):
    """The Anthropic Messages API."""

    provider_name: ClassVar[str] = "anthropic"
    provider: Literal["anthropic"] = "anthropic"
    # Required by the API: the most tokens one step may generate (its profile's cap, else 1024,
    # when none is named).
    max_tokens: pydantic.StrictInt | None = pydantic.Field(default=None, ge=1)
    temperature: pydantic.StrictFloat | None = pydantic.Field(default=None, ge=0, le=1)


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


def check(spec: Any, declared: dict[str, ModelProfile]) -> ProviderSpec:
    """The spec checked for its provider (`scripted` when none is named, the profile's when
    only a profile is) and, for a provider reached with a key, against the deployment's
    profiles `declared`: ModelSpecError naming the field and what to do otherwise."""
    checked = _parsed(spec, lambda named: _provider_of_profile(named, declared))
    if isinstance(checked, EndpointSpec):
        checked.endpoint(declared)
    return checked


def check_shape(spec: Any) -> ProviderSpec:
    """What a declaration (an agent in Python or in the catalog) can be checked for when it
    loads, before a deployment's profiles are known: no secret, a known provider, that
    provider's fields (a spec naming only a profile is read as an OpenAI-compatible one). The
    endpoint is checked when a worker starts and when a run is stored (`check`)."""
    return _parsed(spec, lambda named: "openai" if "profile" in named else DEFAULT_PROVIDER)


def _parsed(spec: Any, provider_of_profile: Callable[[Mapping[str, Any]], Any]) -> ProviderSpec:
    if not isinstance(spec, Mapping):
        raise ModelSpecError(
            f"model must be an object with a provider ({', '.join(sorted(PROVIDERS))})"
        )
    refuse_secrets(spec)
    provider = spec.get("provider", provider_of_profile(spec))
    found = PROVIDERS.get(provider) if isinstance(provider, str) else None
    if found is None:
        shown = repr(provider)[:40]
        raise ModelSpecError(
            f"model.provider {shown} is not a known provider; known: {', '.join(sorted(PROVIDERS))}"
        )
    return found.parse({**spec, "provider": provider})


def _provider_of_profile(spec: Mapping[str, Any], declared: dict[str, ModelProfile]) -> Any:
    """The provider a spec that names only a profile has: its profile's."""
    name = spec.get("profile")
    if isinstance(name, str) and name in declared:
        return declared[name].provider
    if name is not None:
        raise ModelSpecError(
            f"model.profile is not a profile this deployment declares ({profiles.SETTING}); "
            f"declared: {profiles.listed(declared)}"
        )
    return DEFAULT_PROVIDER
