"""The seam a framework's agent plugs in at: a team's Pydantic AI or OpenAI Agents SDK agent
keeps its code, and liyagent's own agent loop (`runtime/core/agent.py`) stays the loop.

A framework adapter (one module per framework, in `runtime/frameworks/`; its public name in
`liyagent/adapters/`) wraps the team's agent in a `GuestAgent` and the team's tool module
(`LIYAGENT_TOOLS`) holds it at its top level, as it would a `@tool` or an `agent(...)`:

    support = durable(team_agent, name="support", kinds={"refund": "keyed_write:86400"})

Loading the module (`tool_sources.declared_in`) registers three things from it:

- its tools (`tools`): each framework tool as a liyagent `Tool` named `<agent>.<tool>`, with
  the kind the team declared for it (a write when none), its JSON schema from the framework's
  tool definition and its body called as the framework would (arguments validated), so keys,
  in-doubt marks, the send guard and settlement are the native agents' code;
- its agent definition (`definition`): what `liyagent.start_agent(name, input)` starts, whose
  model spec names the guest (`{"provider": "framework", "framework": ..., "agent": name}`,
  `runtime/models/specs.py`): no code, no secret is stored with the run;
- itself, in the registry's `guests`, from which `Services.provider_for` takes the guest's
  `provider()`: a `ModelProvider` that answers each step (exactly one model request, I5) with
  the framework's own model, its HTTP through the send guard, mapping the registry's tool
  names back to the framework's. A final answer that does not fit the agent's output type is
  returned `refused` (the model is told, within the step limit); one that fits carries its
  value (`Typed`), sealed with the answer (`RunView.output`).

Features a run would need and the adapter does not support are refused when the guest is
declared (the process does not start), with a message naming the agent and the feature.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, ClassVar

from runtime.durable.policy import Policy
from runtime.models.base import ModelProvider, StepRequest
from runtime.models.output import OutputType
from runtime.toolbox.tools import AgentDef, Tool


def guest_tool_name(agent: str, tool: str) -> str:
    """A guest's tool as the registry names it: one agent's tools never collide with
    another's, nor with the tool modules' own."""
    return f"{agent}.{tool}"


class GuestAgent(ABC):
    """A framework's agent registered to run on liyagent's loop (see the module docstring)."""

    # The adapter's name, as the model spec carries it ("pydantic-ai", "openai-agents").
    framework: ClassVar[str]

    def __init__(self, name: str, definition_policy: Policy = Policy.PINNED) -> None:
        self.name = name
        # What its runs do when a worker's code no longer serves their pinned definition
        # (runtime/durable/pins.py), as for a native agent.
        self.definition_policy = definition_policy
        # The instructions its provider sends with each request (None: none). A run is asked
        # with the ones pinned when it started (`StepRequest.instructions`), not these.
        self.instructions: str | None = None

    @abstractmethod
    def tools(self, origin: str) -> list[Tool]:
        """Its tools as the registry holds them, named `guest_tool_name(self.name, tool)`."""

    @abstractmethod
    def provider(self) -> ModelProvider:
        """What answers each of its runs' steps; built once per process and kept."""

    def output_type(self) -> OutputType | None:
        """The type its final answer is checked against by its own provider (None: text); what
        an app's `RunView.output` is read as."""
        return None

    def instructions_for(self, request: StepRequest) -> str | None:
        """The instructions a step is asked with: those its run pinned when it started (so a
        deploy that changes them never mixes two into one run), or, for a run stored before
        pins, the ones this code gives."""
        if request.instructions is None:
            return self.instructions
        return request.instructions or None  # pinned to none

    def model_name(self) -> str | None:
        """The model its code asks (what a run pins: a deploy that changes it is a drift),
        None when the framework names none."""
        return None

    def system(self) -> str | None:
        """A system prompt put at the start of each run's conversation (sealed with it); None
        when the framework sends its instructions with each request itself."""
        return None

    def model_spec(self) -> dict[str, Any]:
        """The model spec of its runs: it names the guest, nothing else."""
        return {"provider": "framework", "framework": self.framework, "agent": self.name}

    def definition(self, origin: str) -> AgentDef:
        """What `start_agent(name, input)` starts: its model spec, its tools, its prompt."""
        return AgentDef(
            name=self.name,
            model=self.model_spec(),
            tools=[t.name for t in self.tools(origin)],
            system=self.system(),
            origin=origin,
            definition_policy=self.definition_policy,
        )
