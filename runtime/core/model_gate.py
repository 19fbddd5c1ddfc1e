"""A model step's wait on its endpoint's gate (runtime/flow/): the fleet's, not the worker's.

Before each model request the step asks its endpoint's gate (this process's map of the closes
the fleet pushed to it: no network). Closed: a short close (at most `WAIT_IN_PLACE_MAX_MS`) is
waited out in place, the lease checked (so the heartbeat sees progress and keeps renewing it)
and the drain flag watched (a warm shutdown hands the run back); a longer one suspends a run
that may wait (`model:<profile>:<until>`, holding no worker and no lease; the sweeper wakes it
when that time is past, `wake_ready`), and a run that may not wait waits in place. A request
answered 429 closes the gate for the fleet and the step is asked again once it opens: never a
model failure, nothing written.

An endpoint whose profile declares `limits` is also asked, once the gate is open, for room
under the fleet's limits (runtime/flow/limits.py: one Redis script call per request); a wait
it answers is waited the same way as a close (in place when short, else suspended), never
charged as a failure. The request's admission is settled once it is answered.

Each wait is seen (issue 33, item 5), in the words of runtime/flow/waiting.py: a wait in place
is one fenced run event (`agent.run.endpoint_wait`, written once when it starts, whatever the
slices or limits it then waits through: one Postgres write a wait), a suspension says the same
in its own `agent.run.waiting` event, a 429 met is an `agent.run.rate_limited` event; each is
also an event on the step's span and counted in the fleet's counters (`flow:stats`, by the
admit script for a limit's wait, by one HINCRBY for a close's, by the close script for a 429).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, NoReturn

import structlog

from runtime.base import drain, faults
from runtime.base.tenancy import OTHER
from runtime.base.tracing import Tracing
from runtime.core.waiting import Suspend
from runtime.fleet.heartbeat import RunLease
from runtime.fleet.leases import monotonic_ms
from runtime.flow.gate import EndpointGates
from runtime.flow.limits import Admission
from runtime.flow.waiting import ModelWait
from runtime.models.base import ModelError, Usage
from runtime.models.profiles import EndpointLimits

# Closes up to this long are waited out in place; longer ones suspend a run that may wait.
WAIT_IN_PLACE_MAX_MS = 5_000
# How often a wait in place checks its lease and the drain flag (well within a heartbeat's
# stall bound, so a waiting run is never taken for a stalled one).
SLICE_MS = 500
# A 429 on a run with no endpoint profile (a framework's own model) is waited out by its own
# worker: its Retry-After, else this long.
LOCAL_BACKOFF_MS = 1_000
# The run events a wait in place and a 429 are written as (a suspension's is its wait's own).
WAIT_EVENT = "agent.run.endpoint_wait"
RATE_LIMITED_EVENT = "agent.run.rate_limited"

# Writes one run event (kind, step, details), fenced on the attempt (I3): FencedOut if fenced.
Record = Callable[[str, int, dict[str, Any]], None]


class EndpointWait:
    """One attempt's model steps against their endpoint's gate (None: the spec names no
    profile; a 429 is then waited out by this worker alone)."""

    def __init__(
        self,
        gates: EndpointGates,
        profile: str | None,
        lease: RunLease,
        *,
        may_wait: bool,
        hand_back: Callable[[], NoReturn],
        log: structlog.typing.FilteringBoundLogger,
        limits: EndpointLimits | None = None,
        expiry_ms: int = 60_000,
        record: Record | None = None,
        tracing: Tracing | None = None,
        tenant: str = OTHER,
    ) -> None:
        self.gates = gates
        # The run's tenant as the fleet's counters show it (runtime/base/tenancy.py `label`).
        self.tenant = tenant
        # The fleet's limits on the endpoint (None, or none declared: no Redis call), and how
        # long a request's in-flight entry lives (the model timeout).
        self.limits = limits if limits is not None and limits.declared() else None
        self.expiry_ms = expiry_ms
        self.profile = profile
        self.lease = lease
        self.may_wait = may_wait
        self.hand_back = hand_back
        self.log = log
        # Where a wait's and a 429's event go (a run event; an event on the step's span).
        self.record = record
        self.tracing = tracing
        # What this worker itself knows of a close (monotonic ms): a 429 it met while the
        # gates cannot be reached, or on an endpoint without a profile.
        self._until_ms = 0

    def before_request(self, step: int, inputs: int = 0, outputs: int = 0) -> Admission | None:
        """Return once the endpoint is open (at once when it is: no Redis round trip) and,
        where its profile declares limits, the request (`inputs`, `outputs`: its token
        estimates) is admitted under them: its admission, to `after_request` once answered.
        However many closes and limits it waits through in place, it is one wait (one event)."""
        waiting = False
        while True:
            closed = 0 if self.profile is None else self.gates.closed_for_ms(self.profile)
            left = max(closed, self._until_ms - monotonic_ms())
            if left > 0:
                waiting = self._wait_for(left, step, "model.endpoint_closed", None, waiting)
                continue
            if self.limits is None or self.profile is None:
                return None
            admitted = self.gates.limiter.admit(
                self.profile,
                self.limits,
                inputs,
                outputs,
                self.expiry_ms,
                # The script counts this wait, by the rule `_wait_for` follows.
                suspend_above_ms=WAIT_IN_PLACE_MAX_MS if self.may_wait else -1,
                count_wait=not waiting,
                tenant=self.tenant,
            )
            if admitted.wait_ms <= 0:
                return admitted
            waiting = self._wait_for(
                admitted.wait_ms,
                step,
                "model.endpoint_limited",
                admitted.scarcest,
                waiting,
                counted=True,
            )

    def after_request(self, admitted: Admission | None, usage: Usage | None) -> None:
        """The request `admitted` is answered (`usage` its tokens) or failed (None): settled
        with the fleet's limits at this process's next request or flush (no call now)."""
        if admitted is not None and self.limits is not None and self.profile is not None:
            self.gates.limiter.settle(self.profile, self.limits, admitted, usage)

    def _wait_for(
        self,
        left: int,
        step: int,
        event: str,
        scarcest: str | None,
        waiting: bool,
        counted: bool = False,
    ) -> bool:
        """Wait `left` ms for the endpoint: in place when short (or the run may not wait),
        else suspended (`model:<profile>:<until>:<reason>`). A wait that starts (not `waiting`
        already) is recorded and counted (unless the admit script `counted` it); True."""
        said: dict[str, Any] = {"profile": self.profile, "step": step, "wait_ms": left}
        if scarcest is not None:
            said["scarcest"] = scarcest
        wait = ModelWait.of(self.profile or "", left, scarcest, time.time())
        if left > WAIT_IN_PLACE_MAX_MS and self.may_wait and self.profile is not None:
            self.log.info(event, suspends=True, **said)
            if not counted:
                self.gates.count(self.profile, "waits_suspended", self.tenant)
            details = wait.details(left, in_place=False)
            self._trace("liyagent.endpoint_wait", details)
            # Its event is the suspension's own (store/waits.py `suspend`), in the same words.
            raise Suspend(wait.waiting_on(), details)
        self.log.info(event, **said)
        if not waiting:
            if not counted and self.profile is not None:
                self.gates.count(self.profile, "waits_in_place", self.tenant)
            details = wait.details(left, in_place=True)
            self._trace("liyagent.endpoint_wait", details)
            if self.record is not None:
                faults.point("before_endpoint_event")
                self.record(WAIT_EVENT, step, details)
        self._wait(left)
        return True

    def met_429(self, exc: ModelError, step: int) -> None:
        """A request of `step` was answered 429: close the endpoint for the fleet (never
        shortening a longer close); the step is asked again when it opens."""
        if self.profile is None:
            wait = LOCAL_BACKOFF_MS if exc.retry_after_s is None else exc.retry_after_s * 1000
            closed = round(wait)
        else:
            closed = self.gates.close(self.profile, exc.retry_after_s, self.tenant)
        self._until_ms = max(self._until_ms, monotonic_ms() + closed)
        self.log.warning(
            "model.rate_limited",
            profile=self.profile,
            step=step,
            retry_after_s=exc.retry_after_s,
            closed_ms=closed,
        )
        details = {
            "endpoint": self.profile or "",
            "retry_after_s": exc.retry_after_s,
            "closed_ms": closed,
        }
        self._trace("liyagent.rate_limited", details)
        if self.record is not None:
            faults.point("before_endpoint_event")
            self.record(RATE_LIMITED_EVENT, step, details)

    def _trace(self, name: str, details: dict[str, Any]) -> None:
        """The wait or 429 as an event on the step's span in flight (its model request)."""
        if self.tracing is not None:
            self.tracing.event(name, details)

    def _wait(self, ms: int) -> None:
        """Wait `ms` in place, in slices: each checks the lease (progress for the heartbeat;
        LeaseLost when it is gone) and a warm shutdown hands the run back."""
        end = monotonic_ms() + ms
        while (left := end - monotonic_ms()) > 0:
            if drain.wait(min(left, SLICE_MS) / 1000):
                self.hand_back()
            self.lease.check()
