"""The order desk's refund as a workflow in ordinary Python: name this module next to the tools,
`LIYAGENT_TOOLS=order_desk.tools,order_desk.workflows`, and start it with
`liyagent workflow --name order_desk.refund --params '{"order_id": "A-1001", ...}'`.

Each step is a call through `ctx` with a name; a worker killed at any moment resumes the
workflow on another, which returns the recorded results of the steps already done and takes
up the one in flight by its kind:

- `lookup` (the `lookup_order` read): made again if it was in flight.
- `draft` (an agent run as a child): started once, found again by its key.
- `approve-refund` (a person's approval): the run waits, holding no worker.
- `return-received` (a signal the warehouse sends, `liyagent signal RUN return-received`):
  taken exactly once; the refund goes ahead without it after `return_wait_s`.
- `refund` (the `issue_refund` keyed write): sent again with the same key; the desk dedupes.
- `note` (`add_order_note`, a write with a reader): read back by its key, never sent twice.
- `follow-up` (a durable timer): the customer is told the next day, no worker waiting.
- `tell-customer` (`email_customer`, a plain write): never sent twice; unknown if in doubt.
"""

from __future__ import annotations

from typing import Any

from liyagent import StepOutcomeUnknown, WorkflowContext, WorkflowParams, workflow

DAY_S = 24 * 3600
# The drafting agent's model when none is given: a scripted one (no API key needed).
DRAFT_MODEL: dict[str, Any] = {
    "provider": "scripted",
    "script": {
        "steps": [{"final": "We are sorry your order arrived broken. Your refund is on its way."}]
    },
}


class RefundRequest(WorkflowParams):
    order_id: str
    reason: str
    # How long the customer waits for the follow-up email, and the refund for the returned
    # item (short in tests; a day and a week by default).
    follow_up_s: float = DAY_S
    return_wait_s: float = 7 * DAY_S
    draft_model: dict[str, Any] | None = None


@workflow(
    name="order_desk.refund",
    tools=["lookup_order", "issue_refund", "add_order_note", "email_customer"],
)
def refund(ctx: WorkflowContext, params: RefundRequest) -> dict[str, Any]:
    """Look the order up, have an agent draft the customer's note, wait for a person's
    approval and the returned item, refund once, note it, and tell the customer a day later."""
    order = ctx.call("lookup_order", {"order_id": params.order_id}, step="lookup")
    draft = ctx.agent(
        "draft",
        agent="order-desk-writer",
        input=f"Write two kind sentences to {order['customer']}: their order {order['order_id']} "
        f"({params.reason}) is being refunded.",
        model=params.draft_model or DRAFT_MODEL,
    )
    decision = ctx.approval(
        "approve-refund", order_id=order["order_id"], amount_cents=order["total_cents"]
    )
    if not decision["approved"]:
        ctx.call(
            "add_order_note",
            {"order_id": order["order_id"], "text": f"Refund denied: {decision['reason']}"},
            step="note",
        )
        return {"refunded": False, "why": decision["reason"]}
    returned = ctx.wait_signal("return-received", timeout_s=params.return_wait_s)
    made = ctx.call(
        "issue_refund",
        {
            "order_id": order["order_id"],
            "amount_cents": order["total_cents"],
            "reason": params.reason,
        },
        step="refund",
    )
    ctx.call(
        "add_order_note",
        {"order_id": order["order_id"], "text": f"Refund {made['refund_id']} issued."},
        step="note",
    )
    ctx.sleep("follow-up", params.follow_up_s)
    try:
        ctx.call(
            "email_customer",
            {"order_id": order["order_id"], "subject": "Your refund", "body": draft},
            step="tell-customer",
        )
        told: bool | str = True
    except StepOutcomeUnknown:
        told = "unknown"  # in flight when a worker died: never sent twice; a person checks
    return {
        "refunded": True,
        "refund_id": made["refund_id"],
        "returned": returned,
        "told": told,
    }
