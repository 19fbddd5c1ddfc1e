"""A team's own Python workflows (`@workflow`), as a module outside the repository that
LIYAGENT_TOOLS names: what the workflow tests start, kill and judge from the vendor's records."""

from __future__ import annotations

import json
import os
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from tests.support.drifts import until
from tests.support.stack import TOOLS
from tests.support.user_modules import write_module

MODULE = "acme_flows"
SOURCE = textwrap.dedent(
    '''
    """Acme's workflows: incidents opened by function steps that send the step's key."""

    import asyncio
    import os
    from typing import Any

    from liyagent import StepFailed, WorkflowParams, WorkflowStopped, current_call, workflow


    def vendor() -> str:
        return os.environ["LIYAGENT_VENDOR_URL"].rstrip("/")


    def open_incident(title: str, delay_ms: int = 0) -> dict[str, Any]:
        """A keyed write: the tracker dedupes creates on the key for a day."""
        response = current_call().http.post(
            f"{vendor()}/incidents", json={"title": title},
            headers={"X-Sim-Delay-Ms": str(delay_ms)},
        )
        response.raise_for_status()
        return dict(response.json())


    def comment(issue: str, body: str) -> dict[str, Any]:
        """A plain write with a reader (the tracker finds a comment by its key)."""
        url = f"{vendor()}/issues/{issue}/comments"
        response = current_call().http.post(url, json={"body": body})
        response.raise_for_status()
        return dict(response.json())


    def find_comment(issue: str, body: str) -> dict[str, Any] | None:
        found = current_call().http.get(f"{vendor()}/comments", params={"key": current_call().key})
        found.raise_for_status()
        rows = found.json()
        return rows[0] if isinstance(rows, list) and rows else (rows or None)


    class Fan(WorkflowParams):
        n: int = 20
        delay_ms: int = 300


    @workflow(name="acme.fanout")
    async def fanout(ctx, params: Fan) -> list[str]:
        """A gather of `n` keyed writes at once, each titled by its own step."""
        made = await asyncio.gather(*(
            ctx.step(f"open-{i}", open_incident, f"item-{i}", params.delay_ms,
                     kind="keyed_write", dedupe_window_s=86400)
            for i in range(params.n)
        ))
        return [m["title"] for m in made]


    class Order(WorkflowParams):
        ticket: str = "T-1"


    @workflow(name="acme.order", tools=["ticket.read", "incident.create"])
    def order(ctx, params: Order) -> dict[str, Any]:
        """A read, a keyed write (declared tools), an approval, a timer, a signal, a write."""
        ticket = ctx.call("ticket.read", {"ticket": params.ticket})
        incident = ctx.call("incident.create", {"title": "about " + ticket["title"]})
        decision = ctx.approval("approve", incident=incident["id"])
        if not decision["approved"]:
            return {"denied": decision["reason"]}
        ctx.sleep("cool-down", 1)
        said = ctx.wait_signal("go", timeout_s=600)
        note = ctx.step("note", comment, "ISS-1", f"go: {said}", kind="write", reader=find_comment)
        return {"incident": incident["id"], "signal": said, "note": note["id"]}


    @workflow(name="acme.waits")
    def waits(ctx, params: dict) -> list[Any]:
        """Two signals of one name, taken in order, each once."""
        return [ctx.wait_signal("item"), ctx.wait_signal("item")]


    @workflow(name="acme.two_kinds")
    def two_kinds(ctx, params: dict) -> None:
        ctx.step("x", lambda: 1)
        ctx.step("x", lambda: 2, kind="write")


    @workflow(name="acme.unrecordable")
    def unrecordable(ctx, params: dict) -> Any:
        try:
            ctx.step("bad", lambda o: 1, object())
        except Exception as exc:
            return {"refused": type(exc).__name__, "said": str(exc)}


    @workflow(name="acme.compensate")
    def compensate(ctx, params: dict) -> dict[str, Any]:
        """A step that fails for certain is raised where it was asked: the workflow undoes."""
        def boom() -> None:
            raise ValueError("card declined")
        try:
            ctx.step("charge", boom, kind="write")
        except StepFailed as exc:
            undo = ctx.step("undo", open_incident, "undo charge", kind="keyed_write",
                            dedupe_window_s=86400)
            return {"compensated": undo["title"], "why": str(exc)}
        return {"compensated": None}


    @workflow(name="acme.child")
    def child(ctx, params: dict) -> dict[str, Any]:
        return {"child_of": params.get("parent"), "made": ctx.step("leaf", lambda: "leaf")}


    def echo(i: int) -> int:
        return i


    @workflow(name="acme.same_names")
    async def same_names(ctx, params: dict) -> list[int]:
        """A gather of steps under one name: numbered in the order the gather starts them."""
        return list(await asyncio.gather(*(
            ctx.step("same", echo, i) for i in range(int(params.get("n", 12)))
        )))


    def slow_echo(i: int, ms: int) -> int:
        import time
        time.sleep(ms / 1000)
        return i


    async def branch(ctx, i: int, n: int) -> int:
        """A branch of two steps: its second is asked once its first ends, which the gather's
        branches do in the reverse of the order they start."""
        got = await ctx.step("get", slow_echo, i, 60 * (n - i))
        return await ctx.step("save", echo, got * 10)


    @workflow(name="acme.branches")
    async def branches(ctx, params: dict) -> list[int]:
        n = int(params.get("n", 8))
        return list(await asyncio.gather(*(branch(ctx, i, n) for i in range(n))))


    class Trial(WorkflowParams):
        tag: str
        n: int = 20
        delay_ms: int = 600


    @workflow(name="acme.trial", tools=["ticket.read"])
    async def trial(ctx, params: Trial) -> dict[str, Any]:
        """The kill trial's workflow: a read, a gather of keyed writes each titled by its own
        step, a write with a reader, a signal, all judged from the vendor's records."""
        ticket = await ctx.call("ticket.read", {"ticket": "T-1"}, step="ticket")
        made = await asyncio.gather(*(
            ctx.step(f"open-{i}", open_incident, f"{params.tag}-{i}",
                     params.delay_ms + (i * 97) % params.delay_ms,
                     kind="keyed_write", dedupe_window_s=86400)
            for i in range(params.n)
        ))
        note = await ctx.step("note", comment, params.tag, ticket["title"], kind="write",
                              reader=find_comment)
        go = await ctx.wait_signal("go", timeout_s=900)
        return {"titles": [m["title"] for m in made], "go": go, "note": note["id"]}


    @workflow(name="acme.booking", catches_stop=True)
    def booking(ctx, params: dict) -> dict[str, Any]:
        """Books, pays (slowly when asked), waits to be confirmed; a Stop cancels the booking."""
        booked = ctx.step("book", open_incident, "book room", kind="keyed_write",
                          dedupe_window_s=86400)
        try:
            ctx.step("pay", open_incident, "pay", int(params.get("pay_ms", 0)),
                     kind="keyed_write", dedupe_window_s=86400)
            ctx.wait_signal("confirm")
            ctx.step("confirm", open_incident, "confirm", kind="keyed_write",
                     dedupe_window_s=86400)
            return {"booked": booked["title"]}
        except WorkflowStopped as stop:
            ctx.step("cancel", open_incident, "cancel room", kind="keyed_write",
                     dedupe_window_s=86400)
            return {"cancelled": booked["title"], "at": stop.identity, "in_flight": stop.in_flight}


    @workflow(name="acme.paid")
    def paid(ctx, params: dict) -> dict[str, Any]:
        """Waits for its order's payment event (or gives up after `timeout_s`), then notes it."""
        got = ctx.wait_event("order.paid", match=params["order"], timeout_s=params.get("timeout_s"))
        return {"order": params["order"], "paid": got}


    @workflow(name="acme.nest")
    def nest(ctx, params: dict) -> Any:
        """A tree: each level waits for its child; the leaf keeps writing, one tick a step."""
        depth = int(params.get("depth", 0))
        if depth > 0:
            return ctx.workflow("down", "acme.nest", {"depth": depth - 1})
        return [
            ctx.step(f"tick-{i}", open_incident, f"tick-{i}", 200, kind="keyed_write",
                     dedupe_window_s=86400)["title"]
            for i in range(100)
        ]


    @workflow(name="acme.parent")
    def parent(ctx, params: dict) -> dict[str, Any]:
        answer = ctx.agent("ask", agent="helper", input="summarise", model=params["model"])
        sub = ctx.workflow("sub", "acme.child", {"parent": ctx.run_id})
        return {"agent": answer, "sub": sub}
    '''
)

# The version deployed after the first: a step inserted before the others, one removed, two
# swapped; the names keep their identities, so no step takes another's result.
EDITED = SOURCE.replace(
    """        ticket = ctx.call("ticket.read", {"ticket": params.ticket})""",
    """        ctx.step("inserted", lambda: "new step")
        ticket = ctx.call("ticket.read", {"ticket": params.ticket})""",
)


def install_flows(
    stack: Any, home: Path, monkeypatch: pytest.MonkeyPatch, source: str = SOURCE
) -> None:
    """The module where only PYTHONPATH finds it, named with the built-in vendor tools in
    LIYAGENT_TOOLS for every process started from now on (this one too)."""
    home.mkdir(exist_ok=True)
    write_module(home, MODULE, source)
    monkeypatch.setenv("PYTHONPATH", f"{home}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    monkeypatch.syspath_prepend(str(home))
    sys.modules.pop(MODULE, None)
    stack.reconfigure(tool_modules=(*TOOLS, MODULE))


def waiting_on(stack: Any, run_id: str, prefix: str) -> str:
    """What the run waits on, once it waits on something starting with `prefix`."""
    until(
        lambda: (stack.client.get(run_id).waiting_on or "").startswith(prefix),
        f"run {run_id} waiting on {prefix}",
    )
    return str(stack.client.get(run_id).waiting_on)


def incidents(stack: Any, run_id: str) -> list[str]:
    """The titles of the incidents the tracker created (not the deduped replays) for a run."""
    rows = stack.vendor(
        "SELECT body FROM sim.requests WHERE run_id = :r AND vendor = 'incidents' "
        "AND method = 'POST' AND status = 201 ORDER BY id",
        r=run_id,
    )
    return [
        json.loads(r.body)["title"] if isinstance(r.body, str) else r.body["title"] for r in rows
    ]
