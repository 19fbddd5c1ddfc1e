"""The order desk's tools and its agent: name this module in `LIYAGENT_TOOLS=order_desk.tools`
and every liyagent process (worker, beat, front, CLI) loads them at start.

Each tool declares the kind the engine settles it by after a crash:

- `lookup_order` is a read: made again on resume (an async tool, using `ctx.http.aget`).
- `issue_refund` is a keyed write: the desk dedupes refunds on the `Idempotency-Key` header for a
  day, so a refund in doubt is sent again with the same key and the desk answers the refund it
  already made. Never two refunds.
- `add_order_note` is a write with a reader: a note in doubt is looked up by its key; found, it
  is reused; not found, the model is told and it is not sent again.
- `email_customer` is a plain write: the mail cannot be asked what it sent, so an email in
  doubt is reported unknown to the model and never sent twice.

`ctx.http` sends the step's key as `Idempotency-Key` on every request and passes the engine's
send guard, so a worker that lost its run cannot send anything more.
"""

from __future__ import annotations

import json
import os
from typing import Annotated, Any

from pydantic import BaseModel, Field

from liyagent import CallContext, ToolError, agent, tool

REFUND_DEDUPE_S = 24 * 3600  # the desk's promise, see order_desk/service.py


def desk_url() -> str:
    """Where the desk's service is (read at call time, so workers follow the environment)."""
    return os.environ.get("ORDER_DESK_URL", "http://127.0.0.1:8790").rstrip("/")


class Order(BaseModel):
    order_id: str
    customer: str
    email: str
    total_cents: int
    status: str


class Refund(BaseModel):
    refund_id: int
    order_id: str
    amount_cents: int


class Note(BaseModel):
    note_id: int
    order_id: str
    text: str


@tool.read
async def lookup_order(ctx: CallContext, order_id: str) -> Order:
    """Look an order up by its id: the customer, the total in cents and its status."""
    response = await ctx.http.aget(f"{desk_url()}/orders/{order_id}")
    if response.status_code == 404:
        raise ToolError(f"there is no order {order_id}", 404)
    response.raise_for_status()
    return Order.model_validate(response.json())


@tool.keyed_write(dedupe_window_s=REFUND_DEDUPE_S)
def issue_refund(
    ctx: CallContext,
    order_id: str,
    amount_cents: Annotated[int, Field(gt=0, description="at most the order's total")],
    reason: str,
) -> Refund:
    """Refund part or all of an order to the customer's card."""
    response = ctx.http.post(
        f"{desk_url()}/refunds",
        json={"order_id": order_id, "amount_cents": amount_cents, "reason": reason},
    )
    response.raise_for_status()  # a 4xx is a refusal told to the model; a 5xx is in doubt
    return Refund.model_validate(response.json())


@tool.write
def add_order_note(ctx: CallContext, order_id: str, text: str) -> Note:
    """Add an internal note to an order, for the next person who handles it."""
    response = ctx.http.post(f"{desk_url()}/orders/{order_id}/notes", json={"text": text})
    response.raise_for_status()
    return Note.model_validate(response.json())


@add_order_note.read_back
def find_order_note(ctx: CallContext, order_id: str, text: str) -> Note | None:
    """The note this call's key made, if the desk has it."""
    response = ctx.http.get(
        f"{desk_url()}/orders/{order_id}/notes", params={"idempotency_key": ctx.key}
    )
    response.raise_for_status()
    notes = response.json()["notes"]
    return Note.model_validate(notes[0]) if notes else None


@tool.write
def email_customer(ctx: CallContext, order_id: str, subject: str, body: str) -> dict[str, Any]:
    """Email the customer of an order."""
    response = ctx.http.post(
        f"{desk_url()}/emails", json={"order_id": order_id, "subject": subject, "body": body}
    )
    response.raise_for_status()
    return dict(response.json())


SYSTEM = (
    "You are the order desk. Look the order up first. Refund only what the customer paid, note "
    "what you did on the order, then email the customer a short, kind summary."
)

# A scripted model that plays one refund conversation (no API key needed; each step takes a
# moment, so there is time to kill a worker mid-run). Point the agent at a real model with
# ORDER_DESK_MODEL, e.g. '{"provider": "anthropic", "model": "claude-sonnet-4-6"}' (and
# ANTHROPIC_API_KEY) or '{"provider": "openai", "model": "gpt-4o-mini"}' (and OPENAI_API_KEY).
DEMO_SCRIPT = {
    "steps": [
        {
            "calls": [
                {"id": "toolu_lookup", "tool": "lookup_order", "args": {"order_id": "A-1001"}}
            ],
            "latency_ms": 1500,
        },
        {
            "calls": [
                {
                    "id": "toolu_refund",
                    "tool": "issue_refund",
                    "args": {
                        "order_id": "A-1001",
                        "amount_cents": 4599,
                        "reason": "arrived broken",
                    },
                },
                {
                    "id": "toolu_note",
                    "tool": "add_order_note",
                    "args": {"order_id": "A-1001", "text": "Refunded in full: arrived broken."},
                },
            ],
            "latency_ms": 1500,
        },
        {
            "calls": [
                {
                    "id": "toolu_email",
                    "tool": "email_customer",
                    "args": {
                        "order_id": "A-1001",
                        "subject": "Your refund",
                        "body": "Sorry it arrived broken: we refunded the full 45.99.",
                    },
                }
            ],
            "latency_ms": 1500,
        },
        {"final": "Refunded order A-1001 in full, noted it, and emailed Dana.", "latency_ms": 500},
    ]
}


def model_spec() -> dict[str, Any]:
    """The agent's model: ORDER_DESK_MODEL (JSON) if set, else the scripted demo model."""
    raw = os.environ.get("ORDER_DESK_MODEL", "").strip()
    if not raw:
        return {"provider": "scripted", "script": DEMO_SCRIPT}
    spec = json.loads(raw)
    if not isinstance(spec, dict):
        raise ValueError("ORDER_DESK_MODEL must be a JSON object (a model spec)")
    return spec


order_desk = agent(
    "order-desk",
    model=model_spec(),
    tools=[lookup_order, issue_refund, add_order_note, email_customer],
    system=SYSTEM,
)
