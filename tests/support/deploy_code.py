"""The code a rolling deploy replaces (tests/trials/test_rolling_deploys.py): one tool module,
`deploy_desk`, in two versions, each declaring the same desk three ways, a native agent
(`agent(...)`), a Pydantic AI agent and an OpenAI Agents SDK agent (`durable(...)`), each under
both definition policies, over the order desk's service (examples/order_desk): a read (look an
order up), a keyed write (a refund, deduped by the desk on its Idempotency-Key) and a plain
write (an email).

`Change` names what the next version changes; `source(change)` is the module's text for a
version (`None`: the old one). The models' names and the desk's address come from the
environment the module is imported in (`MODEL_ENV`, `BASE_URL_ENV`, ORDER_DESK_URL).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from tests.support.scripts import call, final, step

MODULE = "deploy_desk"
# The environment each agent kind reads its model's name from, and the frameworks' endpoint.
MODEL_ENV = {
    "native": "DEPLOY_NATIVE_MODEL",
    "pydantic": "DEPLOY_PYDANTIC_MODEL",
    "sdk": "DEPLOY_SDK_MODEL",
}
BASE_URL_ENV = "DEPLOY_BASE_URL"
POLICIES = ("pinned", "follow_latest")
# The tools' names as each kind's model sees them (the native tools carry a prefix).
NATIVE_PREFIX = "deploy."


class Change(StrEnum):
    """What the new code changes (one trial case each)."""

    PROMPT = "prompt"  # the agents' instructions reworded
    BODY = "body"  # the lookup's code changed, not its name, kind or arguments
    RENAMED = "renamed"  # lookup_order is find_order
    REMOVED = "removed"  # email_customer is gone
    KIND = "kind"  # email_customer was a write, is declared a read
    SCHEMA = "schema"  # issue_refund takes one more (optional) argument
    OUTPUT = "output"  # the answer's type has one more (optional) field
    FORMAT = "format"  # a newer liyagent release: step records of a newer format


def agent_name(kind: str, policy: str) -> str:
    """The registered name of one agent of the module (`kind` a key of MODEL_ENV)."""
    return f"deploy-{kind}-{'follow' if policy == 'follow_latest' else 'pinned'}"


@dataclass(frozen=True)
class Version:
    """What one version of the module says, as the parts `source` writes."""

    instructions: str = "You are the order desk. Look the order up, refund, email a summary."
    lookup: str = "lookup_order"
    lookup_body: str = "return _order(http, order_id)"
    email: bool = True
    email_kind: str = "write"
    refund_extra: str = ""
    output_extra: str = ""
    newer_format: bool = False


OLD = Version()
NEW = {
    Change.PROMPT: Version(
        instructions="You are the order desk (v2). Check the order, refund it, tell the customer."
    ),
    Change.BODY: Version(
        lookup_body='found = _order(http, order_id)\n    return {**found, "checked": True}'
    ),
    Change.RENAMED: Version(lookup="find_order"),
    Change.REMOVED: Version(email=False),
    Change.KIND: Version(email_kind="read"),
    Change.SCHEMA: Version(refund_extra=', currency: str = "USD"'),
    Change.OUTPUT: Version(output_extra='\n    currency: str = "USD"'),
    Change.FORMAT: Version(newer_format=True),
}


def source(change: Change | None) -> str:
    """The module's text: the old version, or the new one for `change`."""
    v = OLD if change is None else NEW[change]
    return "\n".join(
        [
            _HEAD.replace("@VERSION@", "old" if change is None else f"new ({change.value})"),
            _FORMAT if v.newer_format else "",
            _SHARED.replace("@INSTRUCTIONS@", repr(v.instructions))
            .replace("@OUTPUT_EXTRA@", v.output_extra)
            .replace("@CODE@", repr("old" if change is None else "new")),
            _native(v),
            _framework(v),
            _AGENTS,
        ]
    )


_HEAD = '''"""The deploy trial's desk, @VERSION@ version (tests/support/deploy_code.py)."""

from __future__ import annotations

import os
from typing import Any

import httpx
from agents import Agent as SdkAgent
from agents import OpenAIChatCompletionsModel, function_tool
from openai import AsyncOpenAI
from pydantic import BaseModel
from pydantic_ai import Agent as PydanticAgent
from pydantic_ai.models.openai import OpenAIChatModel
from pydantic_ai.providers.openai import OpenAIProvider

from liyagent import CallContext, agent, tool
from liyagent.adapters.openai_agents import durable as durable_sdk
from liyagent.adapters.pydantic_ai import CallTransport
from liyagent.adapters.pydantic_ai import durable as durable_pydantic
'''

# This models a newer liyagent release, not a team's change: its step records are written in a
# newer format (3), which it reads beside the current one (2). A worker of the old release that
# meets such a record hands the run back; it never fails it.
_FORMAT = """
from runtime.durable import formats

formats.STEP_RECORD.writes = 3
formats.STEP_RECORD.reads = frozenset({2, 3})
"""

_SHARED = """
INSTRUCTIONS = @INSTRUCTIONS@


def desk_url() -> str:
    return os.environ["ORDER_DESK_URL"].rstrip("/")


class DeskAnswer(BaseModel):
    order_id: str
    refunded_cents: int
    summary: str@OUTPUT_EXTRA@


# Every result says which code made it: the model server's records then show which version
# served each call of a run.
CODE = @CODE@


def _order(http: Any, order_id: str) -> dict[str, Any]:
    response = http.get(f"{desk_url()}/orders/{order_id}")
    response.raise_for_status()
    return {**response.json(), "code": CODE}


def _post(http: Any, path: str, body: dict[str, Any]) -> dict[str, Any]:
    response = http.post(f"{desk_url()}{path}", json=body)
    response.raise_for_status()
    return {**response.json(), "code": CODE}


# The frameworks' tools call the desk through liyagent's transport (the call's key, the guard).
desk = httpx.Client(transport=CallTransport(), timeout=10)
"""


def _native(v: Version) -> str:
    """The native agent's tools (`ctx.http`: the call's key, the send guard)."""
    email = (
        f'''
@tool.{v.email_kind}(name="{NATIVE_PREFIX}email_customer")
def native_email(ctx: CallContext, order_id: str, subject: str, body: str) -> dict[str, Any]:
    """Email the customer of an order."""
    return _post(ctx.http, "/emails", {{"order_id": order_id, "subject": subject, "body": body}})
'''
        if v.email
        else ""
    )
    names = [f"{NATIVE_PREFIX}{v.lookup}", f"{NATIVE_PREFIX}issue_refund"]
    names += [f"{NATIVE_PREFIX}email_customer"] if v.email else []
    return f'''
@tool.read(name="{NATIVE_PREFIX}{v.lookup}")
def native_lookup(ctx: CallContext, order_id: str) -> dict[str, Any]:
    """Look an order up by its id."""
    http = ctx.http
    {v.lookup_body}


@tool.keyed_write(name="{NATIVE_PREFIX}issue_refund", dedupe_window_s=86400)
def native_refund(
    ctx: CallContext, order_id: str, amount_cents: int, reason: str{v.refund_extra}
) -> dict[str, Any]:
    """Refund part or all of an order."""
    body = {{"order_id": order_id, "amount_cents": amount_cents, "reason": reason}}
    return _post(ctx.http, "/refunds", body)
{email}
NATIVE_TOOLS = {names!r}
'''


def _framework(v: Version) -> str:
    """The frameworks' tools: plain functions, registered with each framework's agent."""
    email = (
        '''
def email_customer(order_id: str, subject: str, body: str) -> dict[str, Any]:
    """Email the customer of an order."""
    return _post(desk, "/emails", {"order_id": order_id, "subject": subject, "body": body})
'''
        if v.email
        else ""
    )
    kinds = {v.lookup: "read", "issue_refund": "keyed_write:86400"}
    kinds |= {"email_customer": v.email_kind} if v.email else {}
    functions = [v.lookup, "issue_refund", *(["email_customer"] if v.email else [])]
    return f'''
def {v.lookup}(order_id: str) -> dict[str, Any]:
    """Look an order up by its id."""
    http = desk
    {v.lookup_body}


def issue_refund(order_id: str, amount_cents: int, reason: str{v.refund_extra}) -> dict[str, Any]:
    """Refund part or all of an order."""
    body = {{"order_id": order_id, "amount_cents": amount_cents, "reason": reason}}
    return _post(desk, "/refunds", body)
{email}
FRAMEWORK_TOOLS = [{", ".join(functions)}]
KINDS = {kinds!r}
'''


_AGENTS = """
def _model(kind: str) -> str:
    return os.environ[f"DEPLOY_{kind.upper()}_MODEL"]


def _native(name: str, policy: str) -> Any:
    model = {"profile": "sim", "model": _model("native")}
    return agent(
        name,
        model=model,
        tools=NATIVE_TOOLS,
        system=INSTRUCTIONS,
        output=DeskAnswer,
        definition_policy=policy,
    )


def _pydantic(name: str, policy: str) -> Any:
    provider = OpenAIProvider(base_url=os.environ["DEPLOY_BASE_URL"], api_key="sim-model-key")
    team_agent = PydanticAgent(
        OpenAIChatModel(_model("pydantic"), provider=provider),
        name=name,
        instructions=INSTRUCTIONS,
        output_type=DeskAnswer,
        tools=FRAMEWORK_TOOLS,
    )
    return durable_pydantic(team_agent, kinds=KINDS, definition_policy=policy)


def _sdk(name: str, policy: str) -> Any:
    client = AsyncOpenAI(base_url=os.environ["DEPLOY_BASE_URL"], api_key="sim-model-key")
    team_agent = SdkAgent(
        name=name,
        instructions=INSTRUCTIONS,
        model=OpenAIChatCompletionsModel(model=_model("sdk"), openai_client=client),
        tools=[function_tool(f) for f in FRAMEWORK_TOOLS],
        output_type=DeskAnswer,
    )
    return durable_sdk(team_agent, kinds=KINDS, definition_policy=policy)


native_pinned = _native("deploy-native-pinned", "pinned")
native_follow = _native("deploy-native-follow", "follow_latest")
pydantic_pinned = _pydantic("deploy-pydantic-pinned", "pinned")
pydantic_follow = _pydantic("deploy-pydantic-follow", "follow_latest")
sdk_pinned = _sdk("deploy-sdk-pinned", "pinned")
sdk_follow = _sdk("deploy-sdk-follow", "follow_latest")
"""


ORDER = "A-1001"
ANSWER = {"order_id": ORDER, "refunded_cents": 100, "summary": "Refunded 1.00."}


def script(kind: str, latency_ms: int) -> list[dict[str, Any]]:
    """What the model answers an agent of `kind`: a lookup, the refund, a second lookup, the
    email, then the answer (the output tool's call; the Agents SDK's is text). Each run asks
    for the old code's tool names: a run re-pinned to code without one is told it has none."""
    prefix = NATIVE_PREFIX if kind == "native" else ""

    def ask(n: int, tool: str, **args: Any) -> dict[str, Any]:
        return step(call(f"call_{n}", f"{prefix}{tool}", **args), latency_ms=latency_ms)

    steps = [
        ask(1, "lookup_order", order_id=ORDER),
        ask(2, "issue_refund", order_id=ORDER, amount_cents=100, reason="arrived broken"),
        ask(3, "lookup_order", order_id=ORDER),
        ask(4, "email_customer", order_id=ORDER, subject="Refund", body="Refunded 1.00."),
    ]
    if kind == "sdk":
        return [*steps, final(json.dumps(ANSWER), latency_ms=latency_ms)]
    return [*steps, step(call("call_5", "final_result", **ANSWER), latency_ms=latency_ms)]
