"""Erasure: delete a run's content at once (or every run of an owner), keep a tombstone.

An owner is named as its runs were started: the owner a client gave (`start_run(owner=...)`,
the co-pilot's `user`), or for a Teams person their Microsoft Entra object id (the activity's
`from.aadObjectId`, lower case), never a display name (`runtime/entries/teams/inbox.py`).

One transaction: lock the runs (and their sub-agent runs), stop the ones not finished through
the operator's Stop (queued and waiting ones fail at once), take over the attempt of those in
flight (their attempt is bumped, so each write it tries next is fenced out, I3, and nothing it
does later lands), then delete the content of all of them. What stays is the run's row with
its status and an `agent.run.erased` audit row naming who erased it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import sqlalchemy as sa
import structlog

from runtime.base.changes import RunChanges
from runtime.core.enqueue import BadRequest
from runtime.fleet.leases import Leases
from store.erasure import erase_content, erase_unstarted_turns, fence_out, lock_erasable
from store.errors import LiyagentError
from store.gates import insert_stop
from store.rows import RunNotFound
from store.states import FINISHED

log = structlog.get_logger(__name__)

_NAME = re.compile(r"[^\x00-\x1f\x7f]{1,200}")
# How an operator names an owner (the CLI's help and the errors say it).
OWNER_NAMES = (
    "the owner the client gave, or for a Teams person their Microsoft Entra object id (the "
    "Object ID in the Entra admin center; a Teams activity's from.aadObjectId), in lower case, "
    "never their display name"
)


class OwnerNotFound(LiyagentError, LookupError):
    """No run was ever started for this owner: nothing to erase."""

    def __init__(self, owner: str) -> None:
        super().__init__(
            f"no run has owner {owner!r}; name the owner its runs were started with (runs keep "
            f"their owner after erasure, so one erased before is still found): {OWNER_NAMES}; "
            "nothing was erased"
        )
        self.owner = owner


@dataclass(frozen=True)
class Erased:
    """What an erasure did: each run erased with its status now, and those it stopped first."""

    runs: list[tuple[str, str]]
    stopped: list[str]
    by: str

    def to_json(self) -> dict[str, object]:
        return {
            "erased": [{"run_id": i, "status": st} for i, st in self.runs],
            "stopped": self.stopped,
            "by": self.by,
        }


def erase(
    engine: sa.Engine,
    changes: RunChanges,
    leases: Leases,
    *,
    run_id: str | None = None,
    owner: str | None = None,
    by: str,
) -> Erased:
    """Erase one run (and its sub-agent runs) or every run of `owner`; the runs' followers are
    nudged (`changes`) and their step witnesses dropped (`leases`). An unknown run raises
    RunNotFound, an owner without runs OwnerNotFound; bad input BadRequest; nothing changed."""
    if (run_id is None) == (owner is None):
        raise BadRequest("erase exactly one run (--run) or one owner's runs (--owner)")
    if not _NAME.fullmatch(by.strip()):
        raise BadRequest("an erasure needs who erases (printable, at most 200 characters)")
    if owner is not None and not _NAME.fullmatch(owner):
        raise BadRequest(f"{owner[:60]!r} is not an owner name (printable, 1-200 characters)")
    by = by.strip()
    with engine.connect() as conn:
        conn.execution_options(isolation_level="READ COMMITTED")
        with conn.begin():
            # Twice: a sub-agent run committed while the first waited for its parent's lock is
            # seen by the second; none can be stored after it (its parent's row is held).
            lock_erasable(conn, run_id=run_id, owner=owner)
            targets = lock_erasable(conn, run_id=run_id, owner=owner)
            if not targets:
                raise RunNotFound(str(run_id)) if run_id is not None else OwnerNotFound(str(owner))
            live = [t.id for t in targets if t.status not in FINISHED]
            stopped = []
            for live_id in live:
                stopped += insert_stop(
                    conn, run_id=live_id, agent=None, reason="erasure", by=by, running=False,
                    compensate=False,
                ).failed  # fmt: skip
            stopped += fence_out(conn, live, by=by)
            runs = erase_content(conn, [t.id for t in targets], by=by)
            if owner is not None:
                erase_unstarted_turns(conn, owner)
    for run_id_erased, _ in runs:  # its followers read the run's end now, not on a re-check
        changes.announce(run_id_erased)
    leases.forget_steps([i for i, _ in runs])
    log.info("run.erased", runs=[i for i, _ in runs], stopped=stopped, by=by, owner=owner)
    return Erased(runs, sorted(stopped), by)
