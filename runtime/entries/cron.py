"""Cron triggers of the catalog, fired by beat (`liyagent.cron_fire`, tasks/entries.py).

Starts: one run per trigger and scheduled time (`cron:<trigger>:<slot>`), however many beats
fire, linked to its `cron_runs` record in the inserting statement. Its answer is handed on in
Postgres: the record gets the outcome in the answering statement (`store.cron.cron_end`, in
`store.entries.ends_cte`). A failure is told the same way: the record is marked failed in the
failing statement.
"""

from __future__ import annotations

from datetime import UTC, datetime

from runtime.core.enqueue import BadRequest
from runtime.core.entry import EntryKindName, InPostgres
from runtime.entries.start import ENTRY_POINT_RUN, agents, start_entry, start_flow_entry
from runtime.services import Services
from store.cron import cron_link
from store.rows import RunId

KIND = EntryKindName("cron")
ENTRY = InPostgres(KIND, policy=ENTRY_POINT_RUN)


def fire_cron(s: Services, trigger_name: str, now: datetime | None = None) -> tuple[RunId, bool]:
    """Fire a cron trigger: one run per trigger and scheduled time, however many beats fire."""
    trigger = agents(s.settings, s.tools).cron.get(trigger_name)
    if trigger is None:
        raise BadRequest(f"no cron trigger named {trigger_name!r} in the catalog")
    slot = trigger.slot(now or datetime.now(tz=UTC))
    if trigger.workflow is not None:
        return start_flow_entry(
            s,
            entry_kind=KIND,
            workflow=trigger.workflow,
            params=trigger.params or {},
            request_key=f"cron:{trigger.name}:{slot.isoformat()}",
            owner="cron",
            channel="cron",
            entry={"trigger": trigger.name, "scheduled_at": slot.isoformat()},
            link=cron_link(trigger.name, slot),
        )
    return start_entry(
        s,
        entry_kind=KIND,
        agent=trigger.agent,
        user_input=trigger.input,
        request_key=f"cron:{trigger.name}:{slot.isoformat()}",
        owner="cron",
        channel="cron",
        entry={"trigger": trigger.name, "scheduled_at": slot.isoformat()},
        link=cron_link(trigger.name, slot),
    )
