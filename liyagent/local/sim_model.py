"""Scripts played by the simulators' model (OpenAI-compatible, over HTTP), for the demo, the
kill trials and the tests: what the model was asked is then judged from its own records."""

from __future__ import annotations

import copy
from typing import Any

import httpx

KEY_ENV = "LIYAGENT_SIM_MODEL_KEY"
# Not a secret: the simulators' model only checks that a bearer token is sent.
KEY = "sim-model-key"
# The built-in vendor tools, the tools every local deployment loads.
TOOLS = ("liyagent.vendor_tools",)


def register(sim_url: str, steps: list[dict[str, Any]]) -> dict[str, Any]:
    """Keep the script with the simulators' model; the model spec that plays it."""
    response = httpx.post(f"{sim_url}/v1/scripts", json={"script": {"steps": steps}}, timeout=10)
    response.raise_for_status()
    return {
        "provider": "openai",
        "base_url": f"{sim_url}/v1",
        "model": response.json()["model"],
        "api_key_env": KEY_ENV,
    }


def served(sim_url: str, catalog: dict[str, Any]) -> dict[str, Any]:
    """The catalog with every scripted agent's model served by the simulators instead."""
    out = copy.deepcopy(catalog)
    for agent in out.get("agents", {}).values():
        model = agent.get("model") or {}
        if model.get("provider", "scripted") == "scripted":
            agent["model"] = register(sim_url, model["script"]["steps"])
    return out
