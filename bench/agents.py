"""The agents the bench runs, as scripts for the simulators' model (served over HTTP).

`FIVE_STEP` is the issue's agent: 5 model steps and 5 tool calls, 2 of them writes (a keyed
incident create and a comment). The counting section also runs agents made to isolate one kind
of step: `only_final` (one model step, no call: the fixed cost of a run), `reads(k)` (k steps
of one read each, then the answer) and `writes(k)` (k steps of one write each, alternating the
keyed incident create and the comment, then the answer).
"""

from __future__ import annotations

from typing import Any

TOOLS = ["ticket.read", "incident.create", "issue.comment"]
MODEL_STEPS = 5  # of FIVE_STEP
USER_INPUT = "Checkout fails for some customers"

Steps = list[dict[str, Any]]


def _read(n: int) -> dict[str, Any]:
    return {"id": f"toolu_read_{n}", "tool": "ticket.read", "args": {"ticket": f"T-{n}"}}


def _incident(n: int) -> dict[str, Any]:
    return {
        "id": f"toolu_incident_{n}",
        "tool": "incident.create",
        "args": {"title": f"Outage {n}"},
    }


def _comment(n: int) -> dict[str, Any]:
    body = f"Investigating ({n})."
    return {
        "id": f"toolu_comment_{n}",
        "tool": "issue.comment",
        "args": {"issue": "ENG-1", "body": body},
    }


def _final(latency_ms: int) -> dict[str, Any]:
    return {
        "final": "Handled: ticket read, incident opened, engineering told.",
        "latency_ms": latency_ms,
    }


def five_step(latency_ms: int) -> Steps:
    """5 model steps, 5 calls (3 reads, 2 writes): reads, a write, a read, a write, the answer."""
    calls = [[_read(1), _read(2)], [_incident(1)], [_read(3)], [_comment(1)]]
    return [*({"calls": c, "latency_ms": latency_ms} for c in calls), _final(latency_ms)]


def only_final(latency_ms: int = 0) -> Steps:
    """One model step that answers: the run's fixed cost."""
    return [_final(latency_ms)]


def reads(k: int, latency_ms: int = 0) -> Steps:
    """k read-only steps (one read each), then the answer."""
    return [
        *({"calls": [_read(n)], "latency_ms": latency_ms} for n in range(1, k + 1)),
        _final(latency_ms),
    ]


def writes(k: int, latency_ms: int = 0) -> Steps:
    """k steps with exactly one write each (incident create and comment in turn), then the
    answer."""
    make = (_incident, _comment)
    steps = [{"calls": [make[n % 2](n)], "latency_ms": latency_ms} for n in range(k)]
    return [*steps, _final(latency_ms)]


def model_steps(steps: Steps) -> int:
    return len(steps)


def calls(steps: Steps) -> int:
    return sum(len(s.get("calls", [])) for s in steps)
