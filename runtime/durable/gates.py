"""Gates, checked as they stand now at every start, resume and step (I7).

Run-level gates (a Stop, the owner, the channel, the run-as principal) fail the run with the
reason; containment is per call: a refused call is not made and the model is told why.
"""

from __future__ import annotations

from store.rows import GateRow, RunRow


def _why(reason: str | None) -> str:
    return f" ({reason})" if reason else ""


def stop_text(gates: GateRow) -> str:
    """What the Stop standing on a run says (a lifted one: that it was stopped)."""
    if gates.stop_reason is None:
        return "stopped"
    return f"stopped by {gates.stop_by}: {gates.stop_reason}"


def run_refusal(gates: GateRow, run: RunRow) -> str | None:
    """Why the run may not go on now, or None."""
    if gates.stop_reason is not None and not gates.compensating:
        return stop_text(gates)
    if not gates.owner_may_run:
        return f"its owner {run.owner} may no longer run it{_why(gates.owner_reason)}"
    if not gates.channel_enabled:
        return f"its channel {run.channel} is disabled{_why(gates.channel_reason)}"
    if not gates.run_as_may_act:
        principal = run.run_as or run.owner
        return (
            f"the principal it acts as, {principal}, may no longer act{_why(gates.run_as_reason)}"
        )
    return None


def call_refusal(gates: GateRow, agent: str, allowed: list[str], tool: str) -> str | None:
    """Why this call of `agent`'s run may not be made now (containment), or None."""
    # Fail closed: a run may use exactly the tools sealed in its definition; none means none.
    if tool not in allowed:
        return f"tool {tool} is not among the tools this run may use"
    if gates.agent_tools is not None and tool not in gates.agent_tools:
        return f"agent {agent} is contained: tool {tool} is not allowed for it now"
    return None
