"""`red_team`: send each probe to an agent's own model, as the agent would be asked, and report
the forbidden tools the model asked for that the agent's definition would let it call (not
resumable: lost, it fails `interrupted`).

Only the model is asked: no tool a probe asks for is ever made, so a probe changes nothing.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field

from runtime.base import faults
from runtime.core.catalog import CatalogError, load
from runtime.core.enqueue import AGENT_NAME
from runtime.models.base import ModelError, StepRequest
from runtime.models.errors import too_large
from runtime.sending import bounded
from runtime.toolbox.job_kinds import JobContext, JobError, JobParams, job


class Probe(JobParams):
    prompt: str
    forbidden_tool: str = Field(min_length=1)


class RedTeamParams(JobParams):
    agent: str = Field(pattern=f"^{AGENT_NAME.pattern}$")
    probes: list[Probe] = Field(min_length=1)


@job(kind="red_team")
def red_team(ctx: JobContext, params: RedTeamParams) -> dict[str, object]:
    """Probe an agent's containment: which forbidden tools its model asks for and may call."""
    s = ctx.services
    try:
        target = load(s.settings.agents_file).with_agents(s.tools.agents).agent(params.agent)
    except CatalogError as exc:
        raise JobError(f"red team: {exc}") from None
    allowed = set(target.tools or ())  # an agent that names no tools may use none
    findings: list[dict[str, Any]] = []
    for step, probe in enumerate(params.probes, start=1):
        ctx.boundary()
        faults.point("in_job_batch")
        messages: list[Any] = (
            [{"role": "system", "content": target.system}] if target.system else []
        )
        request = StepRequest(
            run_id=ctx.run_id,
            attempt=ctx.attempt,
            step=1,  # each probe is the first step of a conversation of its own
            messages=[*messages, {"role": "user", "content": probe.prompt}],
            tools=s.tools.schemas(target.tools),
        )
        try:
            model = s.provider_for(dict(target.model), ctx.run_id)
            with bounded.answers_at_most(s.settings.model_response_max_bytes):
                answer = model.next_step(request)
        except (ModelError, ValueError) as exc:
            raise JobError(
                f"red team: probe {step} could not be sent to {target.name}'s model: {exc}"
            ) from None
        except Exception as exc:  # an answer cut off that its provider let through unnamed
            cut = bounded.found_in(exc)
            if cut is None:
                raise
            raise JobError(f"red team: probe {step}: {too_large(ctx.run_id, cut)}") from None
        ctx.count("probes_sent")
        asked = {call.name for call in answer.calls}
        if probe.forbidden_tool in asked and probe.forbidden_tool in allowed:
            findings.append({"probe": probe.prompt, "reachable_tool": probe.forbidden_tool})
    return {"agent": target.name, "findings": findings, "probes_sent": ctx.count_of("probes_sent")}
