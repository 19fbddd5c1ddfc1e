"""The team's agent as it was before liyagent: plain Pydantic AI, its model an OpenAI-compatible
endpoint through the framework's own OpenAI client, its tools calling the order desk's HTTP
service (examples/order_desk/order_desk/service.py) with an httpx client of its own."""

from __future__ import annotations

import os
from typing import Any

import httpx
from pydantic import BaseModel
from pydantic_ai import Agent, ModelRetry
from pydantic_ai.models.openai import OpenAIChatModel
from pydantic_ai.providers.openai import OpenAIProvider

from liyagent.adapters.pydantic_ai import CallTransport

# The one line liyagent asks of the team's HTTP: its transport sends each call's step key and
# passes the send guard (outside a liyagent call it is a plain transport).
desk = httpx.Client(transport=CallTransport(), timeout=10)


def desk_url() -> str:
    return os.environ.get("ORDER_DESK_URL", "http://127.0.0.1:8790").rstrip("/")


class DeskAnswer(BaseModel):
    """What the desk did, as the app reads it (`RunView.output`)."""

    order_id: str
    refunded_cents: int
    summary: str


model = OpenAIChatModel(
    os.environ.get("PYDANTIC_DESK_MODEL", "gpt-4o-mini"),
    provider=OpenAIProvider(
        base_url=os.environ.get("PYDANTIC_DESK_BASE_URL", "https://api.openai.com/v1"),
        api_key=os.environ.get("OPENAI_API_KEY", "unset"),
    ),
)
agent = Agent(
    model,
    name="pydantic-desk",
    instructions="You are the order desk. Look the order up, refund what was paid, then email "
    "the customer a short summary.",
    output_type=DeskAnswer,
)


@agent.tool_plain
def lookup_order(order_id: str) -> dict[str, Any]:
    """Look an order up by its id: the customer, the total in cents and its status."""
    response = desk.get(f"{desk_url()}/orders/{order_id}")
    if response.status_code == 404:
        raise ModelRetry(f"there is no order {order_id}")
    response.raise_for_status()
    return dict(response.json())


@agent.tool_plain
def issue_refund(order_id: str, amount_cents: int, reason: str) -> dict[str, Any]:
    """Refund part or all of an order to the customer's card."""
    response = desk.post(
        f"{desk_url()}/refunds",
        json={"order_id": order_id, "amount_cents": amount_cents, "reason": reason},
    )
    response.raise_for_status()
    return dict(response.json())


@agent.tool_plain
def email_customer(order_id: str, subject: str, body: str) -> dict[str, Any]:
    """Email the customer of an order."""
    response = desk.post(
        f"{desk_url()}/emails", json={"order_id": order_id, "subject": subject, "body": body}
    )
    response.raise_for_status()
    return dict(response.json())
