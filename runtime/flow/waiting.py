"""What a run waiting for a model endpoint's capacity waits for, in one set of words shared by
its events, `inspect`, the client's view, the metrics and its traces (issue 33, item 5).

A wait is on an endpoint (its model profile) for one reason: `closed` (a 429 closed it for the
fleet, runtime/flow/gate.py) or `limited` (the fleet's limits on it are used up, `limit` naming
the scarcest: `requests`, `input_tokens`, `output_tokens` or `in_flight`, runtime/flow/limits.py),
until a moment (wall clock). A wait longer than a wait in place suspends the run on
`model:<profile>:<until epoch s>:<closed | the scarcest limit>`; the sweeper wakes it by the
third part (store/waits.py `wake_ready`), so the fourth, added for the reason, changes nothing
there. A `waiting_on` written before the reason was added decodes with reason `unknown`.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from runtime.flow import budgets
from store.tenants import HELD_ON

PREFIX = "model:"
CLOSED = "closed"
LIMITED = "limited"
# The limits a wait may name as its scarcest (runtime/flow/lua/admit.lua's answers).
LIMITS = ("requests", "input_tokens", "output_tokens", "in_flight")
# The words a wait's event says (`ModelWait.details`).
WORDS = ("endpoint", "reason", "limit", "wait_ms", "until", "in_place")


@dataclass(frozen=True)
class ModelWait:
    """A wait on `endpoint` for `reason` (`closed`, `limited`; `unknown` for an old
    `waiting_on`), `limit` the scarcest when limited, until `until` (epoch seconds)."""

    endpoint: str
    reason: str
    until: float
    limit: str | None = None

    @classmethod
    def of(cls, endpoint: str, wait_ms: int, limit: str | None, now: float) -> ModelWait:
        """A wait of `wait_ms` from `now` (epoch s): closed when no `limit` is named."""
        reason = LIMITED if limit else CLOSED
        return cls(endpoint, reason, round(now + wait_ms / 1000, 3), limit or None)

    def waiting_on(self) -> str:
        """The run's `waiting_on` while it is suspended for this wait."""
        return f"{PREFIX}{self.endpoint}:{self.until:.3f}:{self.limit or self.reason}"

    def details(self, wait_ms: int | None, in_place: bool) -> dict[str, Any]:
        """The words every view of the wait uses (an event's details, inspect, a span)."""
        return {
            "endpoint": self.endpoint,
            "reason": self.reason,
            "limit": self.limit,
            "wait_ms": wait_ms,
            "until": datetime.fromtimestamp(self.until, UTC).isoformat(),
            "in_place": in_place,
        }

    def view(self) -> dict[str, Any]:
        """What a reader of the run is shown (inspect, the client's view): endpoint, reason,
        limit, until (ISO 8601, UTC)."""
        found = self.details(None, in_place=False)
        return {k: found[k] for k in ("endpoint", "reason", "limit", "until")}

    def said(self) -> str:
        """One line for a person: what the run waits for, and until when."""
        why = "closed by a 429" if self.reason == CLOSED else f"its {self.limit} limit"
        if self.reason not in (CLOSED, LIMITED):
            why = "capacity"
        until = datetime.fromtimestamp(self.until, UTC).isoformat(timespec="seconds")
        return f"model endpoint {self.endpoint} ({why}) until {until}"


def decode(waiting_on: str | None) -> ModelWait | None:
    """The model wait a `waiting_on` names, or None (another kind of wait, or none); read
    from the right, so a profile holding ':' still decodes."""
    if not waiting_on or not waiting_on.startswith(PREFIX):
        return None
    parts = waiting_on[len(PREFIX) :].split(":")
    reason, limit = "unknown", None
    if parts[-1] == CLOSED or parts[-1] in LIMITS:
        tail = parts.pop()
        reason, limit = (CLOSED, None) if tail == CLOSED else (LIMITED, tail)
    if len(parts) < 2:
        return None
    try:
        until = float(parts[-1])
    except ValueError:
        return None
    return ModelWait(":".join(parts[:-1]), reason, until, limit)


# A run held for its tenant's turn (runtime/flow/tenants.py).
HELD = HELD_ON


def view_of(waiting_on: str | None, tenant: str | None = None) -> dict[str, Any] | None:
    """What a run waiting on `waiting_on` waits for, when that is capacity: a model endpoint
    (endpoint, reason, limit, until), its tenant's turn (reason `tenant`, the tenant), or a
    budget (reason `budget`, its scope; runtime/flow/budgets.py)."""
    if waiting_on == HELD:
        return {"reason": HELD, "tenant": tenant}
    if (budget := budgets.decode(waiting_on)) is not None:
        return budget.view()
    wait = decode(waiting_on)
    return None if wait is None else wait.view()


def said_of(waiting_on: str | None, tenant: str | None = None) -> str | None:
    """One line for a person on what capacity the run waits for (None: another kind of wait)."""
    if waiting_on == HELD:
        return f"its tenant {tenant}'s turn (its runs in flight are at their bound)"
    if (budget := budgets.decode(waiting_on)) is not None:
        return budget.said()
    wait = decode(waiting_on)
    return None if wait is None else wait.said()


def words(waiting_on: str | None, recorded: dict[str, Any]) -> dict[str, Any]:
    """What a suspension's event says of its model (or budget) wait: the words its worker
    recorded with it, else those its `waiting_on` decodes to (an older row: no wait_ms); {} for
    another wait."""
    if (budget := budgets.decode(waiting_on)) is not None:
        return {**budget.view(), **{k: recorded[k] for k in budgets.WORDS if k in recorded}}
    wait = decode(waiting_on)
    if wait is None:
        return {}
    found = wait.details(None, in_place=False)
    return {**found, **{k: recorded[k] for k in WORDS if k in recorded}}
