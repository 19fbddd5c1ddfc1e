"""`fine_tune`: submit once with a keyed request (the provider dedupes), keep the remote job's
id in the cursor, and poll it on a timer, holding no worker in between."""

from __future__ import annotations

import json

from pydantic import Field

from runtime.toolbox.job_kinds import JobContext, JobError, JobParams, job


class FineTuneParams(JobParams):
    model: str = Field(min_length=1)
    dataset: str = Field(min_length=1)
    duration_s: float = Field(2, gt=0)
    poll_s: float = Field(1.0, gt=0)


@job(kind="fine_tune", resumable=True, tools=("finetune.submit", "finetune.status"))
def fine_tune(ctx: JobContext, params: FineTuneParams) -> str:
    """Submit once (keyed; the provider dedupes), keep the remote id, poll it on a timer."""
    if "remote_id" not in ctx.cursor:
        submitted = ctx.call(
            "submit",
            "finetune.submit",
            {"model": params.model, "dataset": params.dataset, "duration_s": params.duration_s},
        )
        if "id" not in submitted:
            raise JobError(f"the fine-tuning provider refused the job: {submitted}")
        ctx.cursor["remote_id"] = submitted["id"]
        ctx.checkpoint()
    ctx.boundary()
    status = ctx.call("poll", "finetune.status", {"id": ctx.cursor["remote_id"]})
    if status.get("status") == "succeeded":
        return json.dumps(
            {
                "remote_id": ctx.cursor["remote_id"],
                "fine_tuned_model": status.get("fine_tuned_model"),
            }
        )
    if status.get("status") not in ("running", "queued"):
        raise JobError(f"fine-tuning job {ctx.cursor['remote_id']} ended: {status}")
    ctx.checkpoint()
    ctx.wait(params.poll_s)
