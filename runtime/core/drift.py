"""A run whose pin the code this worker runs does not serve (issue 35): never continued
silently on other code.

Every attempt, before it does anything, compares its run's pin (runtime/durable/pins.py: each
tool's kind and argument schema, the agent's output type, as the code declared them when the
run started) with this worker's code. A run with no pin (stored before pins) is served as
before. When they differ, the agent's policy says what happens:

- `pinned` (the default): the run waits for a worker whose code serves it (a fleet mid-deploy
  runs both versions), holding no worker: suspended as `definition:<pin>:<retry at>`, woken by
  the sweeper at growing intervals (2 s, up to a minute) for any worker to try. Once it has
  waited `LIYAGENT_DEFINITION_WAIT_S` (no such worker remains), it fails with the reason.
- `follow_latest`: it takes this worker's definition now (re-pinned), and goes on; forward
  only: a worker whose code version the fleet first saw before the one the run is pinned to
  (an old worker still up mid-deploy, meeting a run a new one re-pinned) does not take it back
  to its own while a newer worker may take it; once none has within LIYAGENT_DEFINITION_WAIT_S
  (a rollback), the code that remains takes it.

Either way the drift is audited (`agent.run.definition_drift`, with what changed) and told in
the run's events. A changed prompt is no reason to wait: a run is asked with the instructions
it pinned (`Pin.instructions`) on any worker, and takes the new ones only when it follows the
latest. A record of a format this worker does not read (its definition, pin, checkpoint or a
step record, written by newer code: runtime/durable/formats.py) waits the same way
(`definition:newer:<retry at>`) and is never failed by this worker, which cannot read what it
would fail: it waits until a worker that reads it takes it (`liyagent deploy status` shows
it). A call once marked is settled by the kind its mark recorded whatever the new code declares
(I7, runtime/core/calls.py).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, NoReturn

import structlog

from runtime.core.code_versions import deployment_version, newer_than, pinned_model
from runtime.core.deps import AttemptDeps
from runtime.core.waiting import Suspend
from runtime.durable.definition import RunDefinition
from runtime.durable.formats import NewerFormat
from runtime.durable.pins import Drift, Pin, Policy
from store.pins import DEFINITION_WAIT, Drifted, drift_served, note_drift, repin
from store.rows import RunRow

log = structlog.get_logger(__name__)

DRIFT_AUDIT = "agent.run.definition_drift"
# The first retry after a drift, and the longest between two.
FIRST_RETRY_S = 2.0
LONGEST_RETRY_S = 60.0

Audit = Callable[[str, int, dict[str, Any]], None]
Fail = Callable[[str, str, int | None], NoReturn]


def serve_pin(
    d: AttemptDeps, run: RunRow, definition: RunDefinition, audit: Audit, fail: Fail
) -> Pin | None:
    """The pin this worker serves the run by (None: the run has none), once it does as pinned
    (or the run follows the latest and is re-pinned); otherwise suspend it (Suspend) or fail
    it (through `fail`), audited."""
    if run.pin is None:
        return None
    try:
        pin = Pin.open(d.sealer, run.id, run.pin)
    except NewerFormat as exc:
        hand_back(d, run, exc, audit, fail)
    profiles = d.model_profiles()
    model = None
    if pin.model is not None:  # judged only where the run pinned one
        model = pinned_model(definition.model, profiles, d.tools, definition.agent)
    drift = pin.unserved(d.tools, definition.agent, model)
    if not drift:
        return pin
    noted = None
    follows = pin.policy is Policy.FOLLOW_LATEST
    if follows and not newer_than(d.engine, d.tools, profiles, pin.code):
        # Older code than the run follows (an old worker still up mid-deploy): not taken back
        # to it while a newer worker may take it; once none has within its wait (a rollback),
        # the code that remains takes it.
        noted = _noted(d, run)
        if noted.waited_s < d.settings.timings.definition_wait_s:
            _wait(d, run, noted, pin.id, drift, audit, fail, policy=pin.policy, newer=True)
    if follows:
        version = deployment_version(d.tools, profiles)
        latest = pin.latest(d.tools, definition.agent, definition.tools, model, version)
        with d.engine.connect() as conn:
            repin(conn, run.id, run.attempt, latest.seal(d.sealer, run.id))
        detail = _detail(pin.id, drift, policy=pin.policy, repinned=latest.id)
        if noted is not None:
            detail["back_after_s"] = round(noted.waited_s, 3)
        audit(DRIFT_AUDIT, run.step, detail)
        log.info("run.repinned", run_id=run.id, was=pin.id, now=latest.id)
        return latest
    _wait(d, run, _noted(d, run), pin.id, drift, audit, fail, policy=pin.policy)


def served(d: AttemptDeps, run: RunRow, pin: Pin | None, audit: Audit) -> None:
    """This worker serves a run (its pin, and every record of it read) that may have waited
    for one that does: it waits no more, audited with how long it waited."""
    if run.drift_since is None:
        return
    with d.engine.connect() as conn:
        waited = drift_served(conn, run.id, run.attempt)
    if waited is not None:
        detail = {"served": None if pin is None else pin.id, "waited_s": round(waited, 3)}
        audit(DRIFT_AUDIT, run.step, detail)


def hand_back(d: AttemptDeps, run: RunRow, exc: NewerFormat, audit: Audit, fail: Fail) -> NoReturn:
    """One of the run's records is of a newer format than this worker reads: the run waits for
    a worker of newer code, never failed on this worker's say (it cannot read what it would
    fail)."""
    changes = [Drift("record", exc.record, "format", None, str(exc.found))]
    _wait(d, run, _noted(d, run), "newer", changes, audit, fail, policy=None, newer=True)


def _noted(d: AttemptDeps, run: RunRow) -> Drifted:
    """Since when the run has waited for a worker that serves it (this attempt noted)."""
    with d.engine.connect() as conn:
        return note_drift(conn, run.id, run.attempt)


def _wait(
    d: AttemptDeps,
    run: RunRow,
    noted: Drifted,
    pin_id: str,
    drift: list[Drift],
    audit: Audit,
    fail: Fail,
    *,
    policy: Policy | None,
    newer: bool = False,
) -> NoReturn:
    """Suspend the run until its next retry (retried at growing intervals, at most a minute
    apart), or fail it once it has waited its time; one that waits for newer code (`newer`)
    is never failed here."""
    limit_s = d.settings.timings.definition_wait_s
    said = "; ".join(change.say() for change in drift)
    if noted.waited_s >= limit_s and not newer:
        fail(
            f"run {run.id}: the code the workers run no longer serves its definition ({said}), "
            f"and no worker that does took it within LIYAGENT_DEFINITION_WAIT_S={limit_s} s: "
            "deploy code that declares them again, or start the run anew",
            "definition_drift",
            run.step,
        )
    if noted.first:
        waits_for = "newer_code" if newer else "serving_code"
        audit(DRIFT_AUDIT, run.step, _detail(pin_id, drift, policy=policy, waits_for=waits_for))
        log.warning("run.definition_drift", run_id=run.id, pin=pin_id, drift=said)
    retry_s = min(LONGEST_RETRY_S, max(FIRST_RETRY_S, noted.waited_s / 4))
    if noted.waited_s < limit_s:
        retry_s = min(retry_s, limit_s - noted.waited_s)
    at = time.time() + max(retry_s, 0.0)
    raise Suspend(
        f"{DEFINITION_WAIT}{pin_id}:{at:.3f}", _detail(pin_id, drift, waited_s=noted.waited_s)
    )


def _detail(pin_id: str, drift: list[Drift], **more: Any) -> dict[str, Any]:
    return {"pin": pin_id, "changes": [c.to_json() for c in drift], **more}


__all__ = ["DRIFT_AUDIT", "hand_back", "serve_pin", "served"]
