"""Scripts played by the simulators' model (OpenAI-compatible, over HTTP), for the demo, the
kill trials and the tests: what the model was asked is then judged from its own records."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import httpx

from runtime.models.profiles import as_setting

# The model profile the simulators' model is declared as, and its key's variable (never one of
# liyagent's own settings: runtime/models/profiles.py).
PROFILE = "sim"
KEY_ENV = "SIM_MODEL_API_KEY"
# Not a secret: the simulators' model only checks that a bearer token is sent.
KEY = "sim-model-key"
# The built-in vendor tools, the tools every local deployment loads.
TOOLS = ("liyagent.vendor_tools",)


def register(sim_url: str, steps: list[dict[str, Any]]) -> dict[str, Any]:
    """Keep the script with the simulators' model; the model spec that plays it."""
    response = httpx.post(f"{sim_url}/v1/scripts", json={"script": {"steps": steps}}, timeout=10)
    response.raise_for_status()
    return {"profile": PROFILE, "model": response.json()["model"]}


def profiles(sim_url: str, limits: dict[str, int] | None = None) -> str:
    """`LIYAGENT_MODEL_PROFILES` declaring the simulators' model (OpenAI-compatible) at
    `sim_url` (with `limits`, the fleet's limits on it): what every process of a local
    deployment and of the tests is given."""
    endpoint: dict[str, Any] = {
        "provider": "openai",
        "base_url": f"{sim_url}/v1",
        "api_key_env": KEY_ENV,
    }
    if limits:
        endpoint["limits"] = limits
    return as_setting({PROFILE: endpoint})


def served(sim_url: str, catalog: dict[str, Any]) -> dict[str, Any]:
    """The catalog with every scripted agent's model served by the simulators instead."""
    out = copy.deepcopy(catalog)
    for agent in out.get("agents", {}).values():
        model = agent.get("model") or {}
        if model.get("provider", "scripted") == "scripted":
            agent["model"] = register(sim_url, model["script"]["steps"])
    return out


def limit_model(sim_url: str, limit: dict[str, Any]) -> None:
    """Limit the simulators' model as a provider does (`POST /sim/model/limit`: requests or
    tokens a window, a 429 with Retry-After past them)."""
    httpx.post(f"{sim_url}/sim/model/limit", json=limit, timeout=10).raise_for_status()


def lift_model_limit(sim_url: str) -> None:
    """Lift the simulators' model limit (`DELETE /sim/model/limit`)."""
    httpx.delete(f"{sim_url}/sim/model/limit", timeout=10).raise_for_status()


@contextmanager
def model_limited(sim_url: str, limit: dict[str, Any]) -> Iterator[None]:
    """The simulators' model limited while the block runs, lifted after (whatever happens)."""
    limit_model(sim_url, limit)
    try:
        yield
    finally:
        lift_model_limit(sim_url)
