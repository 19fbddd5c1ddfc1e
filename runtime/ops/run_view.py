"""How a run is read: its id (in full, or a unique prefix), and its view (status, counters, its
answer opened with the seal keys). It needs Postgres and the sealer only, not a process's
services: the client's `get` reads through it, and so do the CLI's `status` and `inspect`,
which start without Redis, tool modules or Celery (runtime/entries/client.py re-exports it)."""

from __future__ import annotations

import re
import uuid
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa

from runtime.base.refused import BadRequest
from runtime.base.sealing import NoSealKeys, Sealer, SealError
from store.records import insert_audit_once
from store.rows import RunNotFound
from store.runs import get_run
from store.states import FINISHED
from store.views import runs_by_id_prefix

# The shortest run id prefix accepted (the demo prints 8 characters).
MIN_PREFIX = 4
# How many matches an ambiguous prefix lists.
PREFIX_MATCHES_SHOWN = 10
_HEX = re.compile(r"[0-9a-f]+")


@dataclass(frozen=True)
class RunView:
    id: str
    status: str
    attempt: int
    lost_count: int
    step: int
    answer: str | None
    failure_reason: str | None
    waiting_on: str | None = None
    # Set when the stored answer does not verify against its seal: it is not shown, never
    # handed on, and the finding is audited (I6).
    answer_error: str | None = None
    # The answer's value when its agent declares an output type (checked against that type by
    # the worker and sealed with the answer); None otherwise.
    output: Any = None

    @property
    def done(self) -> bool:
        return self.status in FINISHED


def parse_id(raw: str, what: str = "run id") -> str:
    try:
        return str(uuid.UUID(str(raw)))
    except ValueError:
        raise BadRequest(f"{raw!r} is not a valid {what} (a UUID)") from None


def resolve_run_id(engine: sa.Engine, raw: str) -> str:
    """A full run id, or the one run a unique prefix of at least MIN_PREFIX hex digits names
    (the demo prints 8). No match: RunNotFound; several: BadRequest listing them."""
    text = raw.strip().lower()
    try:
        return parse_id(text)
    except BadRequest:
        pass
    digits = text.replace("-", "")
    if len(digits) < MIN_PREFIX or len(digits) > 32 or not _HEX.fullmatch(digits):
        raise BadRequest(
            f"{raw!r} is not a valid run id (a UUID) nor a prefix of one (at least {MIN_PREFIX} "
            "hex digits)"
        )
    with engine.connect() as conn:
        found = runs_by_id_prefix(conn, digits, PREFIX_MATCHES_SHOWN + 1)
    matches = [r for r in found if r.id.startswith(text)]
    if not matches:
        raise RunNotFound(raw)
    if len(matches) > 1:
        shown = ", ".join(f"{r.id} ({r.agent}, {r.status})" for r in matches[:PREFIX_MATCHES_SHOWN])
        more = " and more" if len(matches) > PREFIX_MATCHES_SHOWN else ""
        raise BadRequest(
            f"run id prefix {raw!r} is ambiguous: it matches {shown}{more}; give more of the id"
        )
    return matches[0].id


def read_view(engine: sa.Engine, sealer: Sealer, run_id: str) -> RunView:
    """The run as it stands (RunNotFound for an unknown one). Its answer is shown only when it
    verifies against its seal: one that does not is never shown, and is audited once as
    `agent.answer.unverified` (I6); without the seal keys, the view says so instead."""
    with engine.connect() as conn:
        row = get_run(conn, parse_id(run_id))
    answer, answer_error, output = None, None, None
    if row.answer is not None:
        try:
            opened = sealer.open(row.id, "answer", 0, row.answer)
            answer, output = str(opened["text"]), opened.get("output")
        except NoSealKeys as exc:
            answer_error = f"the answer is not shown: {exc}"
        except SealError as exc:
            answer_error = (
                "the stored answer does not verify against its seal; it is not shown and "
                "is never handed on (audited as agent.answer.unverified)"
            )
            with engine.connect() as conn:
                insert_audit_once(
                    conn,
                    run_id=row.id,
                    kind="agent.answer.unverified",
                    detail={"reason": str(exc), "status": row.status},
                )
    return RunView(
        row.id,
        row.status,
        row.attempt,
        row.lost_count,
        row.step,
        answer,
        row.failure_reason,
        row.waiting_on,
        answer_error,
        output,
    )
