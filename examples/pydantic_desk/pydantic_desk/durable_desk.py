"""The agent brought to liyagent: name this module in LIYAGENT_TOOLS and start a run with
`liyagent.start_agent("pydantic-desk", text)` (or `liyagent run --agent pydantic-desk`).

Only the kind of each tool is declared here, so the engine settles each call after a crash:
the desk dedupes refunds on `Idempotency-Key` for a day (a keyed write, sent again with the
same key); an email cannot be asked what it sent (a write: reported unknown, never resent).
"""

from __future__ import annotations

from liyagent.adapters.pydantic_ai import durable
from pydantic_desk.agent import agent

desk = durable(
    agent,
    kinds={
        "lookup_order": "read",
        "issue_refund": "keyed_write:86400",
        "email_customer": "write",
    },
)
