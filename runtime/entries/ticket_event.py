"""Ticket events (`POST /tickets/{ticket_id}/events`, front/entries.py).

Starts: one run of the named catalog agent per ticket and event id (`ticket:<ticket>:<event id>`)
and front principal, its input the event's type and text (a declared Python workflow named
instead of an agent gets them as its parameters: `{"ticket", "type", "text"}`). Its answer is
handed on in Postgres: stored on the run and its transcript in one statement. A failure is told
on the run alone.
"""

from __future__ import annotations

from runtime.core.entry import EntryKindName, InPostgres
from runtime.entries.start import ENTRY_POINT_RUN, start_entry
from runtime.services import Services
from store.rows import RunId

KIND = EntryKindName("ticket_event")
ENTRY = InPostgres(KIND, policy=ENTRY_POINT_RUN)


def start_ticket_event(
    s: Services, agent: str, ticket: str, event_id: str, kind: str, text: str, *, principal: str
) -> tuple[RunId, bool]:
    """The run of `agent` for `principal`'s event `event_id` of `ticket` (made once); (run id,
    new)."""
    return start_entry(
        s,
        entry_kind=KIND,
        agent=agent,
        user_input=f"Ticket {ticket} event {kind}:\n{text}",
        request_key=f"ticket:{ticket}:{event_id}",
        owner="tickets",
        channel="tickets",
        principal=principal,
        flow_params={"ticket": ticket, "type": kind, "text": text},
    )
