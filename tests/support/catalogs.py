"""Catalogs (agents and cron triggers) written for a test."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tests.support.scripts import call, final, step
from tests.support.stack import sim_model


def helper_agent(sim_url: str, latency_ms: int = 0) -> dict[str, Any]:
    """An agent whose model (the simulators' scripted model) reads, comments, then answers."""
    steps = [
        step(call("toolu_e_read", "ticket.read", ticket="T-3"), latency_ms=latency_ms),
        step(
            call("toolu_e_note", "issue.comment", issue="ENG-3", body="seen"),
            latency_ms=latency_ms,
        ),
        final("Answer from helper.", latency_ms=latency_ms),
    ]
    return {"tools": ["ticket.read", "issue.comment"], "model": sim_model(sim_url, steps)}


def write_catalog(
    path: Path, sim_url: str, *, latency_ms: int = 0, cron_every_s: int | None = None
) -> str:
    agents = {"helper": helper_agent(sim_url, latency_ms)}
    catalog: dict[str, Any] = {"agents": agents, "cron": []}
    if cron_every_s is not None:
        catalog["cron"].append(
            {"name": "tick", "agent": "helper", "input": "tick", "every_s": cron_every_s}
        )
    path.write_text(json.dumps(catalog))
    return str(path)
