"""The demo's mixed batch: support runs that read, open incidents, comment and reply, started
through the client API and through the app front (a Teams turn, a webhook call).

Each run exercises a different mix of the call kinds (a read, a keyed write the vendor dedupes,
a write with a reader, a write with neither), with a model latency of 400-900 ms per step so a
worker killed mid-batch has runs in flight at every stage. A Teams turn (a Bot Framework
activity) also ends with the engine posting its reply, with its Adaptive Card, to the Bot
Connector, once.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import httpx

from liyagent.local.botframework import BotChannel, TeamsUser

AGENT = "support-bot"
TOOLS = ["ticket.read", "incident.create", "issue.comment", "chat.reply"]
# The catalog agents the front starts (see `catalog`).
TEAMS_AGENT = "demo-teams"
# The person who asks in Teams: their runs are owned by this Entra object id.
DEMO_USER = TeamsUser("Demo User", "0de0de00-0000-4000-8000-00000000d3e0")
WEBHOOK_AGENT = "demo-webhook"
FRONT_TIMEOUT_S = 15.0


@dataclass(frozen=True)
class BatchRun:
    """A run started through the client API: its request key, what the user asked and the
    model's script."""

    request_key: str
    user_input: str
    script: dict[str, Any]


@dataclass(frozen=True)
class FrontEntry:
    """A run started through the app front: a Teams message (its message id) or a webhook
    call (its event id)."""

    via: str  # teams | webhook
    ref: str
    text: str
    conversation: str = ""


def _call(call_id: str, tool: str, **args: Any) -> dict[str, Any]:
    return {"id": call_id, "tool": tool, "args": args}


def _triage(tag: str) -> list[list[dict[str, Any]]]:
    """Read the ticket and open an incident, comment, then reply in chat."""
    return [
        [
            _call(f"toolu_{tag}_read", "ticket.read", ticket=f"T-{tag}"),
            _call(f"toolu_{tag}_inc", "incident.create", title=f"Checkout errors {tag}"),
        ],
        [_call(f"toolu_{tag}_com", "issue.comment", issue=f"ENG-{tag}", body="Investigating")],
        [_call(f"toolu_{tag}_chat", "chat.reply", conversation=f"conv-{tag}", text="On it")],
    ]


def _comment(tag: str) -> list[list[dict[str, Any]]]:
    return [
        [_call(f"toolu_{tag}_read", "ticket.read", ticket=f"T-{tag}")],
        [_call(f"toolu_{tag}_com", "issue.comment", issue=f"ENG-{tag}", body="Repro attached")],
        [_call(f"toolu_{tag}_read2", "ticket.read", ticket=f"T-{tag}")],
    ]


def _page(tag: str) -> list[list[dict[str, Any]]]:
    return [
        [_call(f"toolu_{tag}_inc", "incident.create", title=f"Payments down {tag}")],
        [_call(f"toolu_{tag}_chat", "chat.reply", conversation=f"conv-{tag}", text="Paged")],
    ]


SHAPES = {
    "triage": (_triage, "Customer reports checkout errors"),
    "comment": (_comment, "Bug report needs a repro note"),
    "page": (_page, "Payments are failing for everyone"),
}
# The order the batch cycles through: API runs between the front's Teams turns and webhooks.
CYCLE = ("triage", "teams", "comment", "webhook", "page")


def _api_run(i: int, name: str, tag: str) -> BatchRun:
    make, ask = SHAPES[name]
    run_tag = f"{tag}{i:02d}"
    steps: list[dict[str, Any]] = []
    for j, calls in enumerate(make(run_tag)):
        steps.append({"calls": calls, "latency_ms": 400 + (i * 137 + j * 251) % 501})
    steps.append({"final": f"Handled {name} {run_tag}.", "latency_ms": 400 + (i * 89) % 501})
    return BatchRun(
        request_key=f"demo-{tag}-{i}",
        user_input=f"{ask} (ticket T-{run_tag})",
        script={"steps": steps},
    )


def batch(n: int, tag: str) -> list[BatchRun | FrontEntry]:
    """`n` runs cycling through API runs, Teams turns and webhook calls."""
    runs: list[BatchRun | FrontEntry] = []
    for i in range(n):
        name = CYCLE[i % len(CYCLE)]
        if name == "teams":
            text = f"Is ticket T-7 being handled? ({tag}{i:02d})"
            runs.append(FrontEntry("teams", f"demo-{tag}-{i}", text, f"teams-conv-{tag}{i:02d}"))
        elif name == "webhook":
            runs.append(FrontEntry("webhook", f"demo-{tag}-{i}", f"Monitor alert {tag}{i:02d}"))
        else:
            runs.append(_api_run(i, name, tag))
    return runs


def _agent(system: str, steps: list[dict[str, Any]], answer: str) -> dict[str, Any]:
    tools = sorted({c["tool"] for s in steps for c in s["calls"]})
    script = {"steps": [*steps, {"final": answer, "latency_ms": 500}]}
    return {"system": system, "tools": tools, "model": {"provider": "scripted", "script": script}}


def catalog() -> dict[str, Any]:
    """The agent catalog the demo's front and workers load (`LIYAGENT_AGENTS_FILE`)."""
    teams = [
        {"calls": [_call("toolu_teams_read", "ticket.read", ticket="T-7")], "latency_ms": 650},
        {
            "calls": [_call("toolu_teams_com", "issue.comment", issue="ENG-7", body="Asked")],
            "latency_ms": 800,
        },
    ]
    webhook = [
        {
            "calls": [
                _call("toolu_hook_read", "ticket.read", ticket="T-9"),
                _call("toolu_hook_inc", "incident.create", title="Monitor alert"),
            ],
            "latency_ms": 700,
        },
        {
            "calls": [_call("toolu_hook_com", "issue.comment", issue="ENG-9", body="Paged")],
            "latency_ms": 550,
        },
    ]
    return {
        "agents": {
            TEAMS_AGENT: _agent(
                "Answer questions asked in Teams.", teams, "T-7 is open; engineering is on it."
            ),
            WEBHOOK_AGENT: _agent(
                "Open an incident for a monitor alert.", webhook, "Incident opened, team paged."
            ),
        }
    }


def front_client(url: str, token: str) -> httpx.Client:
    """An HTTP client for the app front, carrying its bearer token."""
    return httpx.Client(
        base_url=url, timeout=FRONT_TIMEOUT_S, headers={"Authorization": f"Bearer {token}"}
    )


def post_entry(
    http: httpx.Client, entry: FrontEntry, channel: BotChannel, service_url: str
) -> str | None:
    """Send the entry to the front: the webhook's run id, or None for a Teams message (a Bot
    Framework activity the channel signs, replied to at `service_url`; its run is started from
    the durable inbox: find it by the activity id)."""
    if entry.via == "teams":
        # A personal chat: the bot's app is installed for the person who writes to it.
        channel.install_personal(service_url, entry.conversation, DEMO_USER)
        activity = channel.activity(
            activity_id=entry.ref,
            conversation=entry.conversation,
            text=entry.text,
            service_url=service_url,
            sender=DEMO_USER,
        )
        channel.post(http, activity).raise_for_status()
        return None
    answer = http.post(
        f"/webhooks/{WEBHOOK_AGENT}", json={"event_id": entry.ref, "input": entry.text}
    )
    answer.raise_for_status()
    return str(answer.json()["run_id"])
