"""Co-pilot turns (`POST /copilot/turns`, front/entries.py).

Starts: one run of the named catalog agent per conversation and turn id (`copilot:<conversation>:
<turn>`) and front principal, owned by the user who asked as the app names them (`user`: the
app's stable id of the person, never a display name, since erasure and revocation name the
owner). Its answer is handed on in Postgres: stored on the run and its transcript in one
statement. A failure is told on the run alone.
"""

from __future__ import annotations

from runtime.core.entry import EntryKindName, InPostgres
from runtime.entries.start import ENTRY_POINT_RUN, start_entry
from runtime.services import Services
from store.rows import RunId

KIND = EntryKindName("copilot")
ENTRY = InPostgres(KIND, policy=ENTRY_POINT_RUN)


def start_copilot_turn(
    s: Services, agent: str, conversation: str, turn: str, text: str, user: str, *, principal: str
) -> tuple[RunId, bool]:
    """The run of `agent` for `principal`'s turn `turn` of `conversation` (made once); (run
    id, new)."""
    return start_entry(
        s,
        entry_kind=KIND,
        agent=agent,
        user_input=text,
        request_key=f"copilot:{conversation}:{turn}",
        owner=user,
        channel="copilot",
        principal=principal,
    )
