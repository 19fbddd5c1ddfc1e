"""Run a team's OpenAI Agents SDK `agents.Agent` durably on liyagent
(`pip install liyagent[openai-agents]`).

    from liyagent.adapters.openai_agents import durable

    desk = durable(desk_agent, name="order-desk", kinds={"lookup_order": "read",
                   "issue_refund": "keyed_write:86400", "email_customer": "write"})

Hold it at the top level of a module LIYAGENT_TOOLS names; `liyagent.start_agent("order-desk",
text)` starts a run. A tool body that must send the call's step key (a keyed write) sends
with `current_call().http`, or through a client built with
`httpx.Client(transport=CallTransport())` (the body unchanged). How it works:
`runtime/frameworks/openai_agents.py`.
"""

from __future__ import annotations

from runtime.frameworks.openai_agents import (
    CallTransport,
    OpenAIAgentsAgent,
    current_call,
    durable,
)

__all__ = ["CallTransport", "OpenAIAgentsAgent", "current_call", "durable"]
