"""The tool calls of a run, for `inspect`'s transcript: each call a model step asked for, with
its tool, kind, arguments, how it was settled and its result, read from what Postgres holds.

The run's checkpoints (its base and step records, opened against their seals) hold every step's
calls and the results of every step but the last; a marked call (a write) adds its kind, its
settlement and, once recorded, its sealed outcome; a resume's audit names how it took each call
up. A read's result in the last step went only to the model, so none is shown. Secrets never
reach the screen: values under secret-looking names, and values shaped like credentials, are
replaced.
"""

from __future__ import annotations

import itertools
import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from runtime.base.sealing import Sealer, SealError
from runtime.durable import chain
from runtime.durable.formats import NewerFormat
from store.checkpoints import StepRecord
from store.rows import AuditRow, MarkRow, RunRow
from store.states import MarkStatus

# A summary is cut to this many characters (the whole record stays in Postgres).
SUMMARY_CHARS = 160
REDACTED = "[redacted]"
# Names whose values are secrets: matched against the name's words (`api_key`, `apiKey`,
# `X-Auth-Token`, `client_secret`, ...).
_SECRET_WORDS = frozenset(
    {"password", "passwd", "pwd", "secret", "token", "apikey", "auth", "authorization",
     "cookie", "credential", "credentials", "privatekey", "signature"}
)  # fmt: skip
_SECRET_PAIRS = frozenset({("api", "key"), ("private", "key"), ("access", "key")})
# Values that are credentials whatever their name: bearer and basic headers, provider keys
# (`sk-...`), GitHub, Slack, AWS and JWT tokens.
_SECRET_VALUE = re.compile(
    r"(?i)\b(?:bearer|basic)\s+[A-Za-z0-9._~+/=-]{8,}"
    r"|\b(?:sk|pk|rk)-[A-Za-z0-9_-]{8,}"
    r"|\bgh[pousr]_[A-Za-z0-9]{16,}"
    r"|\bxox[abprs]-[A-Za-z0-9-]{8,}"
    r"|\bAKIA[0-9A-Z]{16}\b"
    r"|\beyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]*"
)


@dataclass(frozen=True)
class CallEntry:
    """One tool call as the transcript shows it; `args` and `result` are redacted summaries,
    `at` when it was marked (writes only)."""

    step: int
    call_id: str
    tool: str
    kind: str
    args: str
    settled: str
    result: str
    at: datetime | None


def _is_secret_name(name: str) -> bool:
    words = [w.lower() for w in re.findall(r"[A-Z]?[a-z0-9]+|[A-Z]+(?![a-z])", name)]
    joined = "".join(words)
    if any(w in _SECRET_WORDS for w in words) or joined in _SECRET_WORDS:
        return True
    return any(pair in _SECRET_PAIRS for pair in itertools.pairwise(words))


def redact(value: Any) -> Any:
    """The value with every secret replaced: under a secret-looking name, or shaped like a
    credential anywhere in a string."""
    if isinstance(value, dict):
        return {k: REDACTED if _is_secret_name(str(k)) else redact(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [redact(v) for v in value]
    if isinstance(value, str):
        return _SECRET_VALUE.sub(REDACTED, value)
    return value


def summary(value: Any) -> str:
    """A redacted one-line JSON summary, cut to SUMMARY_CHARS."""
    text = json.dumps(redact(value), sort_keys=True, default=str, ensure_ascii=False)
    return text if len(text) <= SUMMARY_CHARS else text[: SUMMARY_CHARS - 1] + "…"


def _result(content: Any) -> Any:
    """A tool message's content: the outcome's JSON, parsed when it parses."""
    if isinstance(content, str):
        try:
            return json.loads(content)
        except json.JSONDecodeError:
            return content
    return content


def _steps(payload: dict[str, Any]) -> list[tuple[int, list[dict[str, Any]], dict[str, Any]]]:
    """Each step's calls and the results told to the model for them (by call id), oldest
    first: an assistant message with calls starts a step, the tool messages after it are its
    results (the history gives each step its number)."""
    numbers = [int(h.get("step", 0)) for h in payload.get("history") or []]
    steps: list[tuple[int, list[dict[str, Any]], dict[str, Any]]] = []
    for m in payload.get("messages") or []:
        if m.get("role") == "assistant" and m.get("tool_calls"):
            n = numbers[len(steps)] if len(steps) < len(numbers) else len(steps) + 1
            steps.append((n, list(m["tool_calls"]), {}))
        elif m.get("role") == "tool" and steps:
            steps[-1][2].setdefault(str(m.get("tool_call_id")), _result(m.get("content")))
    return steps


def _taken_up(audit: Iterable[AuditRow]) -> dict[tuple[int, str], dict[str, Any]]:
    """How each resume took each call up, by (step, call id): the latest resume counts."""
    out: dict[tuple[int, str], dict[str, Any]] = {}
    for a in audit:
        if a.step is None or not isinstance(a.detail.get("calls"), list):
            continue
        for c in a.detail["calls"]:
            if isinstance(c, dict) and c.get("call_id") is not None:
                out[(a.step, str(c["call_id"]))] = c
    return out


def _mark_outcome(sealer: Sealer, run: RunRow, mark: MarkRow) -> Any:
    """A marked call's recorded outcome, opened against its seal (or why it cannot be)."""
    if mark.outcome is None:
        return None
    try:
        return sealer.open(run.id, f"outcome:{mark.call_index}", mark.step, mark.outcome)
    except (SealError, ValueError, KeyError, TypeError) as exc:
        return f"its recorded outcome does not verify: {exc}"


def _settled(mark: MarkRow | None, taken: dict[str, Any] | None, result: Any) -> str:
    """How the call ended, in the resume audit's words where a record says so."""
    if mark is not None:
        return mark.settlement or ("made" if mark.status == MarkStatus.DONE else "in doubt")
    if taken is not None:
        return str(taken.get("settled"))
    if isinstance(result, dict):
        for key, word in (("refused", "refused"), ("denied", "denied"),
                          ("held_for_approval", "held for approval")):  # fmt: skip
            if key in result:
                return word
    return "made" if result is not None else "no record (its result went only to the model)"


def _kind(
    call_id: str,
    mark: MarkRow | None,
    taken: dict[str, Any] | None,
    result: Any,
    delegations: dict[str, Any],
) -> str:
    """The call's kind, from the first record that names it; reads are never marked."""
    if mark is not None:
        return mark.kind
    if taken is not None and taken.get("kind"):
        return str(taken["kind"])
    if call_id in delegations:
        return "delegation"
    if isinstance(result, dict) and ("held_for_approval" in result or "approval_id" in result):
        return "approval_write"
    if isinstance(result, dict) and "refused" in result:
        return "not marked (refused before it was made)"
    return "read"


def tool_calls(
    sealer: Sealer,
    run: RunRow,
    marks: list[MarkRow],
    audit: list[AuditRow],
    records: Sequence[StepRecord] = (),
) -> list[CallEntry]:
    """Every call the run's steps asked for, oldest first; none when its checkpoint does not
    verify (the checkpoints' own table says why)."""
    if run.checkpoint is None:
        return []
    try:
        payload = chain.rebuild(sealer, run, records).to_payload()
        steps = _steps(payload)
    except (SealError, NewerFormat, ValueError, KeyError, TypeError, AttributeError):
        return []
    by_index = {(m.step, m.call_index): m for m in marks}
    taken_up = _taken_up(audit)
    delegations = dict(payload.get("delegation_keys") or {})
    out = []
    for step, calls, results in steps:
        for index, call in enumerate(calls):
            call_id, tool = str(call.get("id")), str(call.get("name"))
            mark = by_index.get((step, index))
            taken = taken_up.get((step, call_id))
            result = results.get(call_id)
            if result is None and mark is not None:
                result = _mark_outcome(sealer, run, mark)
            out.append(
                CallEntry(
                    step=step,
                    call_id=call_id,
                    tool=tool,
                    kind=_kind(call_id, mark, taken, result, delegations),
                    args=summary(call.get("args") or {}),
                    settled=_settled(mark, taken, result),
                    result="-" if result is None else summary(result),
                    at=None if mark is None else mark.marked_at,
                )
            )
    return out
