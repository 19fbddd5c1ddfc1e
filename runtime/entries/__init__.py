"""Entry points: each kind of run's start, the hand-on of its answer and its policy
(`runtime.core.entry.Policy`), one module (or package) a kind, named by its `KIND`:

- the client API (`plain`, `managed`, `playground`, `resume`) and the operator's actions:
  `client.py`
- webhooks: `webhook.py`; ticket events: `ticket_event.py`; co-pilot turns: `copilot.py`
- cron triggers: `cron.py`; A2A tasks: `a2a.py`; Teams: the package `teams/` (inbox and intake,
  reply, Bot Connector auth, Graph read-back, its settings)

`start.py` is what they share (the catalog's agents, the one start). Each module's `ENTRY` is
registered in the `liyagent.entries` entry-point group (pyproject.toml), which the core loads
(`runtime/core/entry.py`): importing this package registers nothing.
"""
