"""Which attempt runs a run: an agent's model loop, a JSON step graph, a Python workflow, or a
declared job, by the run's kind and its definition."""

from __future__ import annotations

from runtime.core.agent import AgentRun
from runtime.core.attempt import RunAttempt
from runtime.core.jobs import JobRun
from runtime.core.pyflow import PyWorkflowRun
from runtime.core.workflow import WorkflowRun
from runtime.durable.definition import RunDefinition
from store.states import RunKind


def attempt_class(kind: RunKind, definition: RunDefinition) -> type[RunAttempt]:
    """The attempt class for a run of `kind` (a workflow run's definition says which shape)."""
    if kind is RunKind.WORKFLOW:
        return PyWorkflowRun if "python" in (definition.workflow or {}) else WorkflowRun
    return JobRun if kind is RunKind.JOB else AgentRun
