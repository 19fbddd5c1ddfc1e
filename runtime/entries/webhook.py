"""Webhooks (`POST /webhooks/{agent}`, front/entries.py).

Starts: one run of the catalog agent (or, when no agent has the name, of the declared Python
workflow, with the event's `params`) per name and event id (`webhook:<name>:<event id>`) and
front principal, so a repeated delivery returns the run the first one made, and another
caller's event id makes another run. Its answer is handed on in Postgres:
stored on the run and its transcript in one statement, read with `GET /runs/{id}`. A failure
is told on the run alone (its status and reason): a webhook has no row of its own.
"""

from __future__ import annotations

from typing import Any

from runtime.core.entry import EntryKindName, InPostgres
from runtime.entries.start import ENTRY_POINT_RUN, start_entry
from runtime.services import Services
from store.rows import RunId

KIND = EntryKindName("webhook")
ENTRY = InPostgres(KIND, policy=ENTRY_POINT_RUN)


def start_webhook(
    s: Services,
    agent: str,
    event_id: str,
    text: str,
    *,
    principal: str,
    params: dict[str, Any] | None = None,
) -> tuple[RunId, bool]:
    """The run of `agent` (or of the workflow of that name, with `params`) for `principal`'s
    webhook event `event_id` (made once); (run id, new)."""
    return start_entry(
        s,
        entry_kind=KIND,
        agent=agent,
        user_input=text,
        request_key=f"webhook:{agent}:{event_id}",
        owner="webhook",
        channel="webhook",
        principal=principal,
        flow_params=params or {},
    )
