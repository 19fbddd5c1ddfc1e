"""Tools served by an MCP server (built with the official SDK, a real process on loopback) on
real workers: kinds from annotations and overrides, the step key on every call, validation
before anything is marked, and a worker SIGKILLed while a write is in flight. Judged by the
MCP server's own records of every `tools/call` it received."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from liyagent.local.procs import ROOT
from liyagent.local.servers import free_port
from runtime.sending import http
from runtime.sending.call_http import CallHTTP
from runtime.toolbox import mcp_tools
from runtime.toolbox.tools import CallContext, ToolDeclarationError, ToolInDoubt, ToolKind
from tests.support.mcp_server import Served
from tests.support.scripts import call, final, step
from tests.support.stand_in_lease import Lease

TOKEN_ENV = "LYT_ORDERS_MCP_TOKEN"
TOKEN = "mcp-test-token-4711"
KEYED = {"open_case": {"kind": "keyed_write", "dedupe_window_s": 86400}}


@pytest.fixture
def orders(tmp_path, request) -> Iterator[Served]:
    """The MCP server, started with the options a test passes as this fixture's parameter."""
    options = getattr(request, "param", ())
    served = Served(tmp_path, "mcp", *options, env={**os.environ, TOKEN_ENV: TOKEN})
    yield served
    served.close()


def with_mcp(stack, orders: Served, **server) -> None:
    """Every process started from now on (and this one) lists the server's tools."""
    config = orders.config(**server)
    stack.reconfigure(mcp_servers=config)


def refund_script(tag: str, **refund) -> list[dict]:
    args = {"order_id": f"A-{tag}", "amount_cents": 1500, "reason": "damaged", **refund}
    return [
        step(
            call(f"toolu_{tag}_look", "orders.lookup_order", order_id=f"A-{tag}"),
            call(f"toolu_{tag}_refund", "orders.refund_order", **args),
        ),
        final(f"Refunded {tag}."),
    ]


def test_kinds_come_from_annotations_and_the_operators_override(stack, orders) -> None:
    servers = mcp_tools.load_config(orders.config(tools=KEYED))
    tools = {t.name: t for t in mcp_tools.server_tools(servers[0])}
    assert {n: t.kind for n, t in tools.items()} == {
        "orders.lookup_order": ToolKind.READ,  # readOnlyHint: true
        "orders.refund_order": ToolKind.WRITE,  # no annotations
        "orders.open_case": ToolKind.KEYED_WRITE,  # idempotentHint alone would be a write
    }
    assert tools["orders.open_case"].dedupe_window_s == 86400
    [plain] = mcp_tools.load_config(orders.config())
    kinds = {t.name: t.kind for t in mcp_tools.server_tools(plain)}
    assert kinds["orders.open_case"] is ToolKind.WRITE
    # The input schema goes to the model as the server wrote it.
    assert tools["orders.refund_order"].parameters == {
        "type": "object",
        "properties": {
            "order_id": {"title": "Order Id", "type": "string"},
            "amount_cents": {"title": "Amount Cents", "type": "integer"},
            "reason": {"title": "Reason", "type": "string"},
        },
        "required": ["order_id", "amount_cents", "reason"],
        "title": "refund_orderArguments",
    }
    assert "MCP server orders" in tools["orders.refund_order"].origin
    assert orders.calls() == []  # listing calls no tool


def test_tools_are_listed_from_inside_a_running_event_loop(orders) -> None:
    """As the front loads them (its app is built inside uvicorn's loop)."""
    [server] = mcp_tools.load_config(orders.config())

    async def inside() -> list:
        return mcp_tools.server_tools(server)

    assert len(asyncio.run(inside())) == 3


def test_an_override_of_a_tool_the_server_does_not_serve_is_refused(orders) -> None:
    [server] = mcp_tools.load_config(orders.config(tools={"drop_table": "read"}))
    with pytest.raises(ToolDeclarationError, match=r"server orders overrides tools it does not"):
        mcp_tools.server_tools(server)


def test_a_run_reads_and_writes_through_mcp_with_its_key_and_auth(
    stack, orders, monkeypatch
) -> None:
    auth = {"header": "Authorization", "env": TOKEN_ENV, "scheme": "Bearer"}
    monkeypatch.setenv(TOKEN_ENV, TOKEN)  # this process lists the tools too
    with_mcp(stack, orders, auth=auth)
    assert TOKEN not in stack.settings.mcp_servers  # the secret is named, never stored
    stack.worker(env={TOKEN_ENV: TOKEN})
    run_id = stack.start(refund_script("h"), user_input="My order arrived broken")
    view = stack.wait(run_id)
    assert view.status == "succeeded", view
    assert view.answer == "Refunded h."

    [look] = orders.calls("lookup_order")
    [refund] = orders.calls("refund_order")
    assert refund["args"] == {"order_id": "A-h", "amount_cents": 1500, "reason": "damaged"}
    [mark] = stack.rows(
        "SELECT tool, kind, idem_key, status FROM call_marks WHERE run_id = :r", r=run_id
    )
    # The read was never marked; the write was, and its step key reached the server both as
    # the Idempotency-Key header and in the call's _meta.
    assert (mark.tool, mark.kind, mark.status) == ("orders.refund_order", "write", "done")
    assert refund["idem_key"] == refund["meta_key"] == mark.idem_key
    assert (refund["run_id"], refund["attempt"]) == (run_id, "1")
    assert refund["auth"] == f"Bearer {TOKEN}" and look["auth"] == f"Bearer {TOKEN}"
    told = stack.told_by_tool(run_id, 2)
    assert told["orders.lookup_order"]["status"] == "delivered"
    assert told["orders.refund_order"]["refund_id"] == "rf_1"


def test_bad_arguments_and_an_is_error_result_are_told_to_the_model(stack, orders) -> None:
    with_mcp(stack, orders)
    stack.worker()
    script = [
        step(
            call("toolu_bad", "orders.refund_order", order_id=7, amount_cents="lots"),
            call(
                "toolu_big", "orders.refund_order", order_id="A-1", amount_cents=10**6, reason="x"
            ),
        ),
        final("Could not refund."),
    ]
    run_id = stack.start(script)
    assert stack.wait(run_id).status == "succeeded"
    told = told_by_call(stack, run_id, 2)
    assert told["toolu_bad"]["error"] == "invalid arguments; the call was not made"
    fields = {p["field"] for p in told["toolu_bad"]["problems"]}
    assert fields == {"order_id", "amount_cents", "(arguments)"}
    assert "over the limit" in told["toolu_big"]["error"]
    # Only the valid call reached the server; only it was marked (and its outcome recorded).
    assert [c["args"]["amount_cents"] for c in orders.calls()] == [10**6]
    marks = stack.rows("SELECT call_id, status FROM call_marks WHERE run_id = :r", r=run_id)
    assert [(m.call_id, m.status) for m in marks] == [("toolu_big", "done")]


@pytest.mark.kill
@pytest.mark.parametrize(
    ("fault", "received"),
    [("after_mark:kill", 0), ("after_send:kill", 1)],
    ids=["marked-not-sent", "sent-not-recorded"],
)
def test_an_mcp_write_in_doubt_is_reported_unknown_and_never_sent_again(
    stack, orders, fault, received
) -> None:
    with_mcp(stack, orders)
    run_id = stack.kill_then_resume(fault, lambda: stack.start(refund_script("k")))
    view = stack.wait(run_id)
    assert view.status == "succeeded", view
    assert view.lost_count == 1
    assert len(orders.calls("refund_order")) == received  # never sent again
    assert len(orders.calls("lookup_order")) == 2  # a read is made again
    assert_settled(stack, run_id, "unknown")


@pytest.mark.kill
@pytest.mark.parametrize("orders", [("--slow", "refund_order=4000")], indirect=True)
def test_a_worker_killed_while_the_mcp_write_is_in_flight(stack, orders) -> None:
    with_mcp(stack, orders)
    victim = stack.worker("victim")
    run_id = stack.start(refund_script("f"))
    wait_for_call(orders, "refund_order")
    victim.kill()  # SIGKILL while the server is still working on the refund
    stack.worker("survivor")
    stack.beat()
    view = stack.wait(run_id)
    assert view.status == "succeeded", view
    [refund] = orders.calls("refund_order")
    assert refund["attempt"] == "1"
    assert_settled(stack, run_id, "unknown")


@pytest.mark.kill
def test_a_keyed_mcp_write_is_sent_again_with_its_key_and_the_server_dedupes(stack, orders) -> None:
    with_mcp(stack, orders, tools=KEYED)
    script = [
        step(call("toolu_case", "orders.open_case", order_id="A-9", summary="Broken lid")),
        final("Case opened."),
    ]
    run_id = stack.kill_then_resume("after_send:kill", lambda: stack.start(script))
    view = stack.wait(run_id)
    assert view.status == "succeeded", view
    first, second = orders.calls("open_case")
    assert first["idem_key"] == second["idem_key"] == first["meta_key"]
    assert (first["attempt"], second["attempt"]) == ("1", "2")
    assert (first["deduped"], second["deduped"]) == (False, True)
    assert_settled(stack, run_id, "resent")
    assert stack.told(run_id, 2)[0]["case_id"] == "case_1"  # one case, found by its key


@pytest.mark.parametrize("orders", [("--fail", "open_case=503:1")], indirect=True)
def test_a_keyed_mcp_write_answered_5xx_is_resent_within_its_attempt(stack, orders) -> None:
    with_mcp(stack, orders, tools=KEYED)
    stack.worker()
    script = [
        step(call("toolu_case", "orders.open_case", order_id="A-5", summary="Late")),
        final("Case opened."),
    ]
    run_id = stack.start(script)
    assert stack.wait(run_id).status == "succeeded"
    calls = orders.calls("open_case")
    assert [c["deduped"] for c in calls] == [False, True]
    assert len({c["idem_key"] for c in calls}) == 1
    assert stack.told(run_id, 2)[0]["case_id"] == "case_1"


COMMANDS = {
    "worker": ["celery", "-A", "tasks", "worker", "-c", "1"],
    "beat": ["celery", "-A", "tasks", "beat"],
    "cli": ["liyagent.cli.main", "run", "--agent", "desk", "--input", "hi"],
}


@pytest.mark.parametrize("what", sorted(COMMANDS))
def test_an_mcp_server_that_cannot_be_reached_stops_the_process(stack, what) -> None:
    url = f"http://127.0.0.1:{free_port()}/mcp"
    config = json.dumps({"servers": [{"name": "billing", "url": url}]})
    env = {**stack.env, "LIYAGENT_MCP_SERVERS": config}
    done = subprocess.run(
        [sys.executable, "-m", *COMMANDS[what]],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert f"MCP server billing at {url} cannot list its tools" in done.stderr
    assert "Traceback" not in done.stderr


def told_by_call(stack, run_id: str, step: int) -> dict[str, dict]:
    """What the model was told per call id when asked for `step` (the model server's record)."""
    [row] = stack.vendor(
        "SELECT body FROM sim.requests WHERE vendor = 'model' AND run_id = :r AND call = :s "
        "AND status = 200 ORDER BY id DESC LIMIT 1",
        r=run_id,
        s=str(step),
    )
    return {
        m["tool_call_id"]: json.loads(m["content"])
        for m in row.body["messages"]
        if m["role"] == "tool"
    }


def mcp_tool(orders: Served, name: str):
    [server] = mcp_tools.load_config(orders.config())
    return next(t for t in mcp_tools.server_tools(server) if t.name == name)


def call_context(key: str = "k-guard", timeout_s: float = 10.0) -> CallContext:
    http = CallHTTP.for_call(key=key, run_id="r", attempt=1, call="1:c", timeout_s=timeout_s)
    return CallContext("r", 1, 1, "c", "t", key, True, timeout_s, http)


REFUND = {"order_id": "A-g", "amount_cents": 100, "reason": "late"}


def test_the_send_guard_stops_an_mcp_call_before_any_byte_leaves(orders) -> None:
    refund = mcp_tool(orders, "orders.refund_order")
    with http.guarded(Lease(until=time.monotonic() - 0.01)), pytest.raises(http.SendRefused):
        refund.invoke(REFUND, call_context())
    assert orders.calls() == []


@pytest.mark.parametrize("orders", [("--slow", "refund_order=3000")], indirect=True)
def test_an_mcp_call_is_abandoned_when_its_lease_deadline_passes(orders) -> None:
    refund = mcp_tool(orders, "orders.refund_order")
    started = time.monotonic()
    with http.guarded(Lease(until=time.monotonic() + 1.0)), pytest.raises(ToolInDoubt) as info:
        refund.invoke(REFUND, call_context())
    assert time.monotonic() - started < 2.5
    assert "abandoned" in str(info.value)
    assert len(orders.calls("refund_order")) == 1  # it had left: in doubt, not refused


def wait_for_call(orders: Served, tool: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not orders.calls(tool):
        assert time.monotonic() < deadline, f"the MCP server never received {tool}"
        time.sleep(0.02)


def assert_settled(stack, run_id: str, how: str) -> None:
    """The resume audited how the MCP write was taken up, and the model was told."""
    [resumed] = stack.rows(
        "SELECT detail FROM audit_events WHERE run_id = :r AND kind = 'agent.run.crash_resumed'",
        r=run_id,
    )
    settled = {c["tool"]: c["settled"] for c in resumed.detail["calls"]}
    write = next(t for t in settled if t != "orders.lookup_order")
    assert settled[write] == how
    if how == "unknown":
        told = stack.told_by_tool(run_id, 2)[write]
        assert told["outcome"] == "unknown" and "not sent again" in told["note"]


def test_an_mcp_call_whose_server_cannot_be_reached_failed_and_sent_nothing(stack, orders) -> None:
    with_mcp(stack, orders)
    stack.worker()  # it lists the tools while the server is up
    orders.close()  # then the server goes away: every connection is refused
    run_id = stack.start(refund_script("gone"))
    view = stack.wait(run_id)
    assert view.status == "succeeded", view
    marks = stack.rows("SELECT tool, status FROM call_marks WHERE run_id = :r", r=run_id)
    assert [(m.tool, m.status) for m in marks] == [("orders.refund_order", "failed")]
    told = stack.told_by_tool(run_id, 2)
    assert told["orders.refund_order"]["failed"] is True
    assert "the call was not made" in told["orders.refund_order"]["error"]
