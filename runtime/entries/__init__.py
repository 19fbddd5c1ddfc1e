"""Entry points: each kind of run's start, the hand-on of its answer and how it is told of a
failure, one module a kind (`store.entries.EntryKind`):

- the client API (`plain`, `managed`, `playground`, `resume`) and the operator's actions:
  `client.py`
- webhooks: `webhook.py`; ticket events: `ticket_event.py`; co-pilot turns: `copilot.py`
- cron triggers: `cron.py`; A2A tasks: `a2a.py`; Teams: `teams_inbox.py` (who sent a turn, the
  inbox, its intake) and `teams.py` (the reply)

`start.py` is what they share (the catalog's agents, the one start). Importing this package
registers each kind's entry point with the core (`runtime/core/entry.py`), which looks a run's
kind up there and names none of them.
"""

from runtime.core.entry import register
from runtime.entries.a2a import ENTRY as _A2A
from runtime.entries.client import ENTRY as _CLIENT
from runtime.entries.copilot import ENTRY as _COPILOT
from runtime.entries.cron import ENTRY as _CRON
from runtime.entries.teams import ENTRY as _TEAMS
from runtime.entries.ticket_event import ENTRY as _TICKET_EVENT
from runtime.entries.webhook import ENTRY as _WEBHOOK

for _point in (_CLIENT, _WEBHOOK, _TICKET_EVENT, _COPILOT, _CRON, _A2A, _TEAMS):
    register(_point)
