"""Background jobs: a third kind of run, leased, swept and handed back like runs.

A resumable job keeps a durable cursor in its sealed checkpoints and continues from it on any
worker: a source sync checkpoints its cursor per page; a fine-tuning job submits once with a
keyed request, stores the remote job id, and polls it on a timer (waiting without a worker).
Classifier training and red-team runs are not resumable: lost, they fail `interrupted`.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from runtime.base import faults
from runtime.base.validation import described
from runtime.core.attempt import RunAttempt
from runtime.core.enqueue import AGENT_NAME
from runtime.core.waiting import Suspend
from runtime.core.workflow import workflow_key
from runtime.durable.state import RunState, ToolCall
from runtime.fleet.heartbeat import RunLease
from runtime.sending import http
from runtime.services import Services
from store.documents import Document, upsert_documents
from store.rows import GateRow, RunRow


class JobError(ValueError):
    """The job's parameters or source are unusable; the job fails with this reason (or, for
    parameters checked at enqueue, is never stored)."""


class _Params(BaseModel):
    """A job kind's parameters: unknown ones are refused, so a typo is caught at enqueue."""

    model_config = ConfigDict(extra="forbid")


class SourceSyncParams(_Params):
    """`source`: `dir:<path>` (files by name) or an http(s) URL serving JSON pages."""

    source: str
    page_size: int = Field(10, ge=1, le=500)

    @field_validator("source")
    @classmethod
    def _known_scheme(cls, value: str) -> str:
        if value == "dir:" or not value.startswith(("dir:", "http://", "https://")):
            raise ValueError("use dir:<path> or an http(s) URL")
        return value


class FineTuneParams(_Params):
    model: str = Field(min_length=1)
    dataset: str = Field(min_length=1)
    duration_s: float = Field(2, gt=0)
    poll_s: float = Field(1.0, gt=0)


class Example(_Params):
    text: str
    label: str = Field(min_length=1)


class ClassifierParams(_Params):
    examples: list[Example] = Field(min_length=1)
    batch_size: int = Field(10, ge=1)


class Probe(_Params):
    prompt: str
    forbidden_tool: str = Field(min_length=1)


class RedTeamParams(_Params):
    agent: str = Field(pattern=f"^{AGENT_NAME.pattern}$")
    probes: list[Probe] = Field(min_length=1)


@dataclass(frozen=True)
class JobKind:
    name: str
    resumable: bool
    run: Callable[[JobRun, RunState, dict[str, Any]], str]
    params: type[_Params]
    # The tools its runs may call, and only those (a run is offered no tool it does not name).
    tools: tuple[str, ...] = ()

    def check(self, params: dict[str, Any]) -> None:
        """Refuse parameters this kind cannot run with (JobError naming each field)."""
        try:
            self.params.model_validate(params)
        except ValidationError as exc:
            raise JobError(f"bad parameters ({described(exc, 'params')})") from None


class JobRun(RunAttempt):
    def __init__(
        self, services: Services, run: RunRow, lease: RunLease, gates: GateRow | None = None
    ) -> None:
        super().__init__(services, run, lease, key_for=workflow_key(run), gates=gates)
        # Outcomes of the call the checkpoint left, taken up on resume: the job reuses them.
        self._taken_up: dict[str, dict[str, Any]] = {}

    def _loop(self, state: RunState) -> str:
        job = self.run.spec.get("job") or {}
        kind = JOB_KINDS.get(str(job.get("kind")))
        if kind is None:
            self._fail(f"unknown job kind {job.get('kind')!r}", "bad_job")
        left = list(state.calls)
        if self._resume_calls(state):
            for call, message in zip(left, state.messages[-len(left) :], strict=True):
                self._taken_up[call.id] = json.loads(message["content"])
            state.count("executed")
        try:
            summary = kind.run(self, state, dict(job.get("params") or {}))
        except JobError as exc:
            self._fail(str(exc), "job_error")
        self._finish(summary)
        return "succeeded"

    def page_done(self, state: RunState) -> None:
        """Checkpoint the cursor after a unit of work (a page, a poll)."""
        state.step += 1
        self._checkpoint(state)
        faults.point("after_checkpoint")

    def call(self, state: RunState, call: ToolCall) -> dict[str, Any]:
        """Make one tool call through the same checkpoint-mark-send-record path as runs; a
        call the checkpoint left and the resume took up is not made again."""
        if call.id in self._taken_up:
            return self._taken_up.pop(call.id)
        state.step += 1
        state.calls = [call]
        gates = self._checkpoint(state)
        faults.point("after_checkpoint")
        results, _ = self.router.route(state, resuming=False, gates=gates)
        state.add_results(results)
        state.count("executed")
        outcome: dict[str, Any] = json.loads(results[0]["content"])
        return outcome


def _fetch_page(
    source: str, page: int, size: int, job: JobRun
) -> tuple[list[Document], int | None]:
    """One page of a source: `dir:<path>` (files by name) or `http(s)://...` (JSON pages)."""
    if source.startswith("dir:"):
        root = Path(source[4:])
        if not root.is_dir():
            raise JobError(f"source {source}: not a directory")
        files = sorted(p for p in root.rglob("*") if p.is_file())
        chunk = files[page * size : (page + 1) * size]
        docs = [
            Document(str(p.relative_to(root)), p.name, p.read_text(errors="replace")) for p in chunk
        ]
        return docs, (page + 1 if (page + 1) * size < len(files) else None)
    if source.startswith(("http://", "https://")):
        try:
            response = http.shared_client().get(
                source,
                params={"page": page, "size": size},
                headers={"X-Liyagent-Run": job.run.id, "X-Liyagent-Attempt": str(job.run.attempt)},
                timeout=job.s.settings.timings.call_timeout_s,
            )
            response.raise_for_status()
            body = response.json()
        except (httpx.HTTPError, ValueError) as exc:
            raise JobError(f"source {source}: page {page} could not be read ({exc})") from exc
        docs = [
            Document(str(d["id"]), str(d.get("title", d["id"])), str(d.get("content", "")))
            for d in body.get("docs", [])
        ]
        nxt = body.get("next")
        return docs, (int(nxt) if nxt is not None else None)
    raise JobError(f"source {source!r}: use dir:<path> or an http(s) URL")


def source_sync(job: JobRun, state: RunState, params: dict[str, Any]) -> str:
    """Page through a source, upserting each page idempotently, then checkpointing the cursor."""
    source, size = str(params.get("source", "")), int(params.get("page_size", 10))
    if not 1 <= size <= 500:
        raise JobError("page_size must be 1..500")
    page: int | None = int(state.cursor.get("page", 0))
    while page is not None:
        job._boundary(state)
        docs, nxt = _fetch_page(source, page, size, job)
        with job.s.engine.connect() as conn:
            changed = upsert_documents(
                conn, run_id=job.run.id, attempt=job.run.attempt, source=source, docs=docs
            )
        state.count("pages")
        state.count("documents", len(docs))
        state.count("changed", changed)
        faults.point("after_page")
        state.cursor["page"], page = nxt, nxt
        job.page_done(state)
    return json.dumps(
        {
            "source": source,
            "pages": state.count_of("pages"),
            "documents_seen": state.count_of("documents"),
            "documents_changed": state.count_of("changed"),
        },
        sort_keys=True,
    )


def fine_tune(job: JobRun, state: RunState, params: dict[str, Any]) -> str:
    """Submit once (keyed; the provider dedupes), keep the remote id, poll it on a timer."""
    if "remote_id" not in state.cursor:
        submitted = job.call(
            state,
            ToolCall(
                "submit",
                "finetune.submit",
                {
                    "model": params.get("model"),
                    "dataset": params.get("dataset"),
                    "duration_s": params.get("duration_s", 2),
                },
            ),
        )
        if "id" not in submitted:
            raise JobError(f"the fine-tuning provider refused the job: {submitted}")
        state.cursor["remote_id"] = submitted["id"]
        job.page_done(state)
    job._boundary(state)
    status = job.call(state, ToolCall("poll", "finetune.status", {"id": state.cursor["remote_id"]}))
    if status.get("status") == "succeeded":
        return json.dumps(
            {
                "remote_id": state.cursor["remote_id"],
                "fine_tuned_model": status.get("fine_tuned_model"),
            }
        )
    if status.get("status") not in ("running", "queued"):
        raise JobError(f"fine-tuning job {state.cursor['remote_id']} ended: {status}")
    job.page_done(state)
    raise Suspend(f"timer:{time.time() + float(params.get('poll_s', 1.0)):.3f}")


def classifier_training(job: JobRun, state: RunState, params: dict[str, Any]) -> str:
    """Train a multinomial naive Bayes text classifier in batches (not resumable)."""
    examples = params.get("examples") or []
    if not examples or not all(
        isinstance(e, dict) and "text" in e and "label" in e for e in examples
    ):
        raise JobError('classifier training needs "examples": [{"text", "label"}]')
    counts: dict[str, dict[str, int]] = {}
    priors: dict[str, int] = {}
    batch = max(1, int(params.get("batch_size", 10)))
    for start in range(0, len(examples), batch):
        job._boundary(state)
        faults.point("in_job_batch")
        for example in examples[start : start + batch]:
            label = str(example["label"])
            priors[label] = priors.get(label, 0) + 1
            words = counts.setdefault(label, {})
            for token in str(example["text"]).lower().split():
                words[token] = words.get(token, 0) + 1
    top = {label: sorted(words, key=lambda w: -words[w])[:5] for label, words in counts.items()}
    return json.dumps({"labels": priors, "top_tokens": top}, sort_keys=True)


def red_team(job: JobRun, state: RunState, params: dict[str, Any]) -> str:
    """Probe an agent's containment: which forbidden tools its definition would let it call."""
    from runtime.core.catalog import load

    target = load(job.s.settings.agents_file).agent(str(params.get("agent")))
    findings = []
    for probe in params.get("probes") or []:
        job._boundary(state)
        faults.point("in_job_batch")
        tool = str(probe.get("forbidden_tool"))
        if tool in (target.tools or ()):  # an agent that names no tools may use none
            findings.append({"probe": probe.get("prompt"), "reachable_tool": tool})
    return json.dumps({"agent": target.name, "findings": findings}, sort_keys=True)


JOB_KINDS: dict[str, JobKind] = {
    k.name: k
    for k in (
        JobKind("source_sync", True, source_sync, SourceSyncParams),
        JobKind(
            "fine_tune", True, fine_tune, FineTuneParams, ("finetune.submit", "finetune.status")
        ),
        JobKind("classifier_training", False, classifier_training, ClassifierParams),
        JobKind("red_team", False, red_team, RedTeamParams),
    )
}
