"""Step idempotency keys: pure functions of what identifies a step, never clock or chance (I8)."""

from __future__ import annotations

import hashlib
import re
import uuid

# Provider tool-call ids that only number the call's position ("call_0", "0", "tool_3") say
# nothing about which call it is: a regenerated step reuses them for different calls.
_POSITIONAL = re.compile(r"^(?:call|tool|toolu|fc)?[_-]?\d{1,4}$", re.IGNORECASE)


def is_positional(tool_call_id: str) -> bool:
    """True when the id is only a position number, so no stable key may be derived from it."""
    return bool(_POSITIONAL.match(tool_call_id.strip()))


def _digest(*parts: object) -> str:
    text = "\x1f".join(str(p) for p in parts)
    return hashlib.sha256(text.encode()).hexdigest()[:40]


def agent_call_key(
    correlation_id: str, agent_loop: str, model_steps: int, tool_call_id: str
) -> str | None:
    """The key of one agent tool call, from the run's correlation id, its agent loop, the model
    steps taken and the provider's tool-call id; None for a positional id."""
    if not correlation_id or not agent_loop or not tool_call_id or is_positional(tool_call_id):
        return None
    return "lya-" + _digest("agent", correlation_id, agent_loop, model_steps, tool_call_id)


def fresh_key() -> str:
    """A key for a call outside every scope (an ad hoc call, a positional id): new per call."""
    return "lya-adhoc-" + uuid.uuid4().hex


def workflow_step_key(workflow_run_id: str, step_id: str, steps_executed: int) -> str:
    """The key of one workflow step: a retry (same count) sends the same key, a loop back to
    the step (a higher count) sends a new one."""
    return "lya-wf-" + _digest("workflow", workflow_run_id, step_id, steps_executed)


def flow_step_key(workflow_run_id: str, identity: str) -> str:
    """The key of one step of a Python workflow: its identity is its name and occurrence (how
    often the run had reached a step of that name), so a retry sends the same key and a loop
    back to the step, a later occurrence, a new one."""
    name, _, occurrence = identity.rpartition("#")
    return workflow_step_key(workflow_run_id, name, int(occurrence))


def _written_call_key(
    scope: str,
    correlation_id: str,
    agent_loop: str,
    model_steps: int,
    call_index: int,
    tool_call_id: str,
) -> str:
    # The step is written before this key is used, so the call's position in the step is
    # stable even when the provider's id is only a position number.
    provider_id = "" if is_positional(tool_call_id) else tool_call_id
    return _digest(scope, correlation_id, agent_loop, model_steps, call_index, provider_id)


def delegation_key(
    correlation_id: str, agent_loop: str, model_steps: int, call_index: int, tool_call_id: str
) -> str:
    """The key a delegation finds its child run by, however often it is asked again."""
    return "lya-dlg-" + _written_call_key(
        "delegation", correlation_id, agent_loop, model_steps, call_index, tool_call_id
    )


def approval_step_key(
    correlation_id: str, agent_loop: str, model_steps: int, call_index: int, tool_call_id: str
) -> str:
    """The key that coalesces an approval-held call's requests: one request per step key."""
    return "lya-apr-" + _written_call_key(
        "approval", correlation_id, agent_loop, model_steps, call_index, tool_call_id
    )
