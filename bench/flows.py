"""The bench's Python workflow (section `workflows`, bench/workflow_step.py): k read steps, each
the same declared read an agent's read-only step makes, so a workflow step and an agent step
are told apart only by what the engine does around them."""

from __future__ import annotations

from typing import Any

from liyagent import WorkflowContext, WorkflowParams, workflow


class Reads(WorkflowParams):
    k: int


@workflow(name="bench.reads", tools=["ticket.read"])
def reads(ctx: WorkflowContext, params: Reads) -> list[Any]:
    """k read steps, one after another, each its own name."""
    return [
        ctx.call("ticket.read", {"ticket": f"T-{n}"}, step=f"read-{n}")["id"]
        for n in range(1, params.k + 1)
    ]
