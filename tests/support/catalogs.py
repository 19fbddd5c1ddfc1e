"""Catalogs (agents and cron triggers) written for a test."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tests.support.scripts import call, final, step


def helper_agent(latency_ms: int = 0) -> dict[str, Any]:
    return {
        "tools": ["ticket.read", "issue.comment"],
        "model": {
            "provider": "scripted",
            "script": {
                "steps": [
                    step(call("toolu_e_read", "ticket.read", ticket="T-3"), latency_ms=latency_ms),
                    step(
                        call("toolu_e_note", "issue.comment", issue="ENG-3", body="seen"),
                        latency_ms=latency_ms,
                    ),
                    final("Answer from helper.", latency_ms=latency_ms),
                ]
            },
        },
    }


def write_catalog(path: Path, *, latency_ms: int = 0, cron_every_s: int | None = None) -> str:
    catalog: dict[str, Any] = {"agents": {"helper": helper_agent(latency_ms)}, "cron": []}
    if cron_every_s is not None:
        catalog["cron"].append(
            {"name": "tick", "agent": "helper", "input": "tick", "every_s": cron_every_s}
        )
    path.write_text(json.dumps(catalog))
    return str(path)
