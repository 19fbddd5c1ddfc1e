"""The demo's mixed batch: scripted support runs that read, open incidents, comment and reply.

Each run exercises a different mix of the four call kinds (a read, a keyed write the vendor
dedupes, a write with a reader, a write with neither), with a model latency of 400-900 ms per
step so a worker killed mid-batch has runs in flight at every stage.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

AGENT = "support-bot"
TOOLS = ["ticket.read", "incident.create", "issue.comment", "chat.reply"]


@dataclass(frozen=True)
class BatchRun:
    """One run of the batch: its request key, what the user asked and the model's script."""

    request_key: str
    user_input: str
    script: dict[str, Any]


def _call(call_id: str, tool: str, **args: Any) -> dict[str, Any]:
    return {"id": call_id, "tool": tool, "args": args}


def _triage(tag: str) -> list[list[dict[str, Any]]]:
    """Read the ticket and open an incident, comment, then reply in chat."""
    return [
        [
            _call(f"toolu_{tag}_read", "ticket.read", ticket=f"T-{tag}"),
            _call(f"toolu_{tag}_inc", "incident.create", title=f"Checkout errors {tag}"),
        ],
        [_call(f"toolu_{tag}_com", "issue.comment", issue=f"ENG-{tag}", body="Investigating")],
        [_call(f"toolu_{tag}_chat", "chat.reply", conversation=f"conv-{tag}", text="On it")],
    ]


def _comment(tag: str) -> list[list[dict[str, Any]]]:
    return [
        [_call(f"toolu_{tag}_read", "ticket.read", ticket=f"T-{tag}")],
        [_call(f"toolu_{tag}_com", "issue.comment", issue=f"ENG-{tag}", body="Repro attached")],
        [_call(f"toolu_{tag}_read2", "ticket.read", ticket=f"T-{tag}")],
    ]


def _page(tag: str) -> list[list[dict[str, Any]]]:
    return [
        [_call(f"toolu_{tag}_inc", "incident.create", title=f"Payments down {tag}")],
        [_call(f"toolu_{tag}_chat", "chat.reply", conversation=f"conv-{tag}", text="Paged")],
    ]


def _reply(tag: str) -> list[list[dict[str, Any]]]:
    return [
        [_call(f"toolu_{tag}_read", "ticket.read", ticket=f"T-{tag}")],
        [_call(f"toolu_{tag}_chat", "chat.reply", conversation=f"conv-{tag}", text="Looking")],
        [_call(f"toolu_{tag}_com", "issue.comment", issue=f"ENG-{tag}", body="Customer told")],
    ]


SHAPES = [
    ("triage", _triage, "Customer reports checkout errors"),
    ("comment", _comment, "Bug report needs a repro note"),
    ("page", _page, "Payments are failing for everyone"),
    ("reply", _reply, "Customer asks for an update"),
]


def batch(n: int, tag: str) -> list[BatchRun]:
    """`n` runs cycling through the shapes, each step with its own 400-900 ms latency."""
    runs: list[BatchRun] = []
    for i in range(n):
        name, make, ask = SHAPES[i % len(SHAPES)]
        run_tag = f"{tag}{i:02d}"
        steps: list[dict[str, Any]] = []
        for j, calls in enumerate(make(run_tag)):
            steps.append({"calls": calls, "latency_ms": 400 + (i * 137 + j * 251) % 501})
        steps.append({"final": f"Handled {name} {run_tag}.", "latency_ms": 400 + (i * 89) % 501})
        runs.append(
            BatchRun(
                request_key=f"demo-{tag}-{i}",
                user_input=f"{ask} (ticket T-{run_tag})",
                script={"steps": steps},
            )
        )
    return runs
