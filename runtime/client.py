"""The client API app processes use: start a run, read it, wait for it."""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from typing import Any

import structlog

from runtime.models.scripted import validate_script
from runtime.sealing import SealError
from runtime.services import Services
from runtime.state import RunState
from store.records import select_transcript
from store.rows import RunId, RunNotFound
from store.runs import get_run, insert_run

log = structlog.get_logger(__name__)

TERMINAL = frozenset({"succeeded", "failed"})


class BadRequest(ValueError):
    """The caller's input is invalid; nothing was stored."""


@dataclass(frozen=True)
class RunView:
    id: str
    status: str
    attempt: int
    lost_count: int
    step: int
    answer: str | None
    failure_reason: str | None

    @property
    def done(self) -> bool:
        return self.status in TERMINAL


def parse_run_id(raw: str) -> str:
    try:
        return str(uuid.UUID(raw))
    except (ValueError, AttributeError):
        raise BadRequest(f"{raw!r} is not a run id (a UUID)") from None


class Client:
    def __init__(self, services: Services) -> None:
        self.s = services

    def start_run(
        self,
        *,
        agent: str,
        model: dict[str, Any],
        user_input: str,
        owner: str = "app",
        entry_kind: str = "plain",
        tools: list[str] | None = None,
        system: str | None = None,
        request_key: str | None = None,
    ) -> RunId:
        """Insert the run with its first checkpoint, then publish its message; a request key
        makes this idempotent (the same key returns the same run and publishes nothing)."""
        if not agent.strip():
            raise BadRequest("agent must be a non-empty name")
        if not user_input.strip():
            raise BadRequest("user_input must be non-empty")
        if model.get("provider", "scripted") == "scripted":
            validate_script(model.get("script"))
        run_id = str(uuid.uuid4())
        state = RunState.initial(agent, system, user_input)
        sealed = self.s.sealer.seal(run_id, "checkpoint", 0, state.to_payload())
        spec: dict[str, Any] = {"model": model, "tools": tools, "system": system}
        with self.s.engine.connect() as conn:
            rid, new = insert_run(
                conn,
                run_id=run_id,
                correlation_id=run_id,
                request_key=request_key,
                agent=agent,
                owner=owner,
                entry_kind=entry_kind,
                spec=spec,
                user_input=user_input,
                sealed_checkpoint=sealed,
            )
        if new:
            # A failed publish leaves the run queued; the sweeper republishes it (outbox).
            try:
                self.s.publisher.publish(rid, 1)
            except Exception as exc:
                log.warning(
                    "run.publish_failed",
                    run_id=rid,
                    error=str(exc),
                    next="the sweeper publishes it again once it has waited too long",
                )
        return rid

    def get(self, run_id: str) -> RunView:
        with self.s.engine.connect() as conn:
            row = get_run(conn, parse_run_id(run_id))
        answer = None
        if row.answer is not None:
            try:
                answer = str(self.s.sealer.open(row.id, "answer", 0, row.answer)["text"])
            except SealError:
                answer = None
        return RunView(
            row.id, row.status, row.attempt, row.lost_count, row.step, answer, row.failure_reason
        )

    def transcript(self, run_id: str) -> list[tuple[str, str]]:
        with self.s.engine.connect() as conn:
            return [(m.role, m.content) for m in select_transcript(conn, parse_run_id(run_id))]

    def wait(self, run_id: str, timeout_s: float = 60.0, poll_s: float = 0.1) -> RunView:
        """Poll until the run is succeeded or failed; raise TimeoutError with its state."""
        deadline = time.monotonic() + timeout_s
        while True:
            view = self.get(run_id)
            if view.done:
                return view
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"run {run_id} still {view.status} after {timeout_s}s "
                    f"(attempt {view.attempt}, lost {view.lost_count})"
                )
            time.sleep(poll_s)


__all__ = ["BadRequest", "Client", "RunNotFound", "RunView"]
