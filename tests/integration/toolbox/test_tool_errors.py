"""A team's own tools that fail, on real workers: an error raised while no request of the call
has left the send guard is a definite failure (the model is told its type and message, the mark
is `failed`, the worker logs it once with its traceback, run id and tool); only a call that may
have reached its server is in doubt. Judged from Postgres, the model server's records (what the
model was told), the vendor simulator's records and the worker's log."""

from __future__ import annotations

import json
import socket
from pathlib import Path
from typing import Any

import pytest

from runtime.ops.adhoc import adhoc_call
from tests.support.scripts import call, final, raw_call, step
from tests.support.user_modules import install

MODULE = "acme_failing_tools"
SOURCE = '''
"""Acme's tools that fail in every way a team's own code does."""

import os
from typing import Any

from liyagent import CallContext, Tool, ToolKind, tool

REFUNDS = {{"O-1": 10}}


def url(path: str) -> str:
    return os.environ["LIYAGENT_VENDOR_URL"].rstrip("/") + path


@tool.write(name="acme.refund")
def refund(ctx: CallContext, order: str) -> dict[str, Any]:
    """Refund an order (fails for an order it does not know, before sending anything)."""
    body = {{"body": f"refund {{REFUNDS[order]}}"}}
    return ctx.http.post(url("/issues/ENG-1/comments"), json=body).json()


@tool.read(name="acme.lookup")
async def lookup(ctx: CallContext, ticket: str) -> dict[str, Any]:
    """Look a ticket up (its table is empty: fails before any request)."""
    raise RuntimeError(f"the lookup table has no {{ticket}}")


@tool.write(name="acme.note")
def note(ctx: CallContext, issue: str, body: str) -> dict[str, Any]:
    """Comment on an issue, then fail reading the answer: the comment may have landed."""
    response = ctx.http.post(url(f"/issues/{{issue}}/comments"), json={{"body": body}})
    return {{"id": response.json()["no_such_field"]}}


@tool.write(name="acme.memo")
def memo(ctx: CallContext, issue: str, body: str) -> dict[str, Any]:
    """The same as acme.note, but with a reader: the comment is found by its key."""
    response = ctx.http.post(url(f"/issues/{{issue}}/comments"), json={{"body": body}})
    return {{"id": response.json()["no_such_field"]}}


@memo.read_back
def find_memo(ctx: CallContext, issue: str, body: str) -> dict[str, Any] | None:
    found = ctx.http.get(url("/comments"), params={{"key": ctx.key}}).json()
    return found[0] if found else None


@tool.write(name="acme.page")
async def page(ctx: CallContext, text: str) -> dict[str, Any]:
    """Page on-call through a pager nobody listens on: the connection is refused."""
    response = await ctx.http.apost("http://127.0.0.1:{closed_port}/page", json={{"text": text}})
    return response.json()


def move(args: dict[str, Any], ctx: CallContext) -> dict[str, Any]:
    return {{"moved": REFUNDS[args["account"]]}}


# Declared as a plain Tool (its own invoke, no decorator): classified the same way.
ledger = Tool("acme.ledger", ToolKind.WRITE, "Move money in the ledger.", move)
'''
STEPS = [
    step(
        call("toolu_f_refund", "acme.refund", order="O-9"),
        call("toolu_f_lookup", "acme.lookup", ticket="T-9"),
        call("toolu_f_note", "acme.note", issue="ENG-9", body="Investigating"),
        call("toolu_f_memo", "acme.memo", issue="ENG-10", body="Seen"),
        call("toolu_f_page", "acme.page", text="Checkout down"),
        call("toolu_f_ledger", "acme.ledger", account="A-9"),
    ),
    final("Reported what failed."),
]

COMMENTS = [("issues", "/issues/ENG-9/comments"), ("issues", "/issues/ENG-10/comments")]


def closed_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.fixture
def failing_module(stack, tmp_path: Path, monkeypatch) -> None:
    source = SOURCE.format(closed_port=closed_port())
    install(stack, tmp_path / "acme", monkeypatch, **{MODULE: source})


def log_events(path: Path, event: str, run_id: str) -> list[dict[str, Any]]:
    """The worker's JSON log lines of one event for one run."""
    out = []
    for line in path.read_text(errors="replace").splitlines():
        if not line.startswith("{"):
            continue
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if entry.get("event") == event and entry.get("run_id") == run_id:
            out.append(entry)
    return out


def test_a_tool_that_fails_before_sending_failed_and_one_that_sent_is_in_doubt(
    stack, failing_module
) -> None:
    stack.worker()
    run_id = stack.start(STEPS)
    view = stack.wait(run_id)
    assert view.status == "succeeded", view

    marks = {
        m.tool: (m.status, m.settlement)
        for m in stack.rows("SELECT tool, status, settlement FROM call_marks WHERE run_id = :r",
                            r=run_id)
    }  # fmt: skip
    assert marks == {
        "acme.refund": ("failed", "failed"),  # KeyError before any request
        "acme.page": ("failed", "failed"),  # connection refused: nothing was sent
        "acme.note": ("settled", "unknown"),  # sent, then failed: in doubt, no reader
        "acme.memo": ("done", "read_back"),  # the same, but its reader found it
        "acme.ledger": ("failed", "failed"),  # a plain Tool's KeyError, before any request
    }
    failed = stack.rows(
        "SELECT detail FROM audit_events WHERE run_id = :r AND kind = 'agent.call.failed'",
        r=run_id,
    )
    assert sorted(f.detail["tool"] for f in failed) == ["acme.ledger", "acme.page", "acme.refund"]

    told = stack.told_by_tool(run_id, 2)  # what the model server was sent
    assert told["acme.refund"]["error"] == "KeyError: 'O-9'"
    assert told["acme.refund"]["failed"] is True
    assert "nothing was sent" in told["acme.refund"]["note"]
    assert told["acme.lookup"]["error"] == "RuntimeError: the lookup table has no T-9"
    assert told["acme.page"]["error"].startswith("ConnectError:")
    assert told["acme.page"]["failed"] is True
    assert told["acme.ledger"]["error"] == "KeyError: 'A-9'"
    assert told["acme.note"]["outcome"] == "unknown"
    assert told["acme.note"]["error"] == "KeyError: 'no_such_field'"
    assert "stopped" not in told["acme.note"]["note"]  # no process stopped: the call failed
    assert told["acme.memo"]["body"] == "Seen"  # what its reader found

    writes = stack.vendor_writes(run_id)  # only the comments left, once each
    assert [(w.vendor, w.path) for w in writes] == COMMENTS

    log = stack.tmp / "w1.log"
    for tool, raised in (("acme.refund", "KeyError"), ("acme.lookup", "RuntimeError")):
        [line] = [e for e in log_events(log, "call.failed", run_id) if e["tool"] == tool]
        # Its type and traceback (code locations, the user's own frame among them), never
        # its message: that may carry user text and is told only to the model.
        assert line["error"] == raised and line["message"].startswith("withheld"), line
        assert any(f"{MODULE}.py" in frame for frame in line["frames"]), line
    doubts = log_events(log, "call.in_doubt", run_id)
    assert sorted(d["tool"] for d in doubts) == ["acme.memo", "acme.note"]
    assert all(d["frames"] and d["message"].startswith("withheld") for d in doubts)


@pytest.mark.kill
def test_a_resume_reuses_what_failed_and_what_was_settled_and_sends_nothing_again(
    stack, failing_module
) -> None:
    # Killed once the model answered after the calls: the resume takes up the calls again.
    run_id = stack.kill_then_resume("after_model_step:kill:2", lambda: stack.start(STEPS))
    view = stack.wait(run_id)
    assert view.status == "succeeded", view
    assert view.lost_count == 1
    [resumed] = stack.rows(
        "SELECT detail FROM audit_events WHERE run_id = :r AND kind = 'agent.run.crash_resumed'",
        r=run_id,
    )
    assert {c["tool"]: c["settled"] for c in resumed.detail["calls"]} == {
        "acme.refund": "reused",
        "acme.lookup": "failed",  # a read is made again, and fails again before sending
        "acme.note": "reused",
        "acme.memo": "reused",
        "acme.page": "reused",
        "acme.ledger": "reused",
    }
    told = stack.told_by_tool(run_id, 2)  # the resumed attempt's request
    assert told["acme.refund"]["error"] == "KeyError: 'O-9'"
    assert told["acme.note"]["error"] == "KeyError: 'no_such_field'"  # its sealed outcome
    assert told["acme.page"]["failed"] is True
    writes = stack.vendor_writes(run_id)
    assert [(w.vendor, w.path) for w in writes] == COMMENTS


def test_broken_json_arguments_are_told_to_the_model_which_tries_again(stack) -> None:
    broken = '{"ticket": "T-4"'  # the model's text ends before its object does
    run_id = stack.start(
        [
            step(raw_call("toolu_j_1", "ticket.read", broken)),
            step(call("toolu_j_2", "ticket.read", ticket="T-4")),
            final("T-4 is open."),
        ]
    )
    stack.worker()
    view = stack.wait(run_id)
    assert view.status == "succeeded", view  # not model_error
    assert view.answer == "T-4 is open."
    [told] = stack.told(run_id, 2)  # by the model server's records
    assert told["error"] == "invalid arguments; the call was not made"
    [problem] = told["problems"]
    assert problem["field"] == "(arguments)" and "not valid JSON" in problem["message"]
    [asked] = stack.vendor(
        "SELECT body FROM sim.requests WHERE vendor = 'model' AND run_id = :r AND call = '2' "
        "AND status = 200",
        r=run_id,
    )
    [assistant] = [m for m in asked.body["messages"] if m["role"] == "assistant"]
    assert assistant["tool_calls"][0]["function"]["arguments"] == broken  # as it wrote them
    assert stack.told(run_id, 3)[0]["id"] == "T-4"  # the second try was made
    reads = stack.vendor(
        "SELECT path FROM sim.requests WHERE run_id = :r AND vendor <> 'model'", r=run_id
    )
    assert [r.path for r in reads] == ["/tickets/T-4"]  # the broken call was never made


def test_an_adhoc_call_tells_a_failure_from_a_doubt(stack, failing_module) -> None:
    s = stack.services
    failed = adhoc_call(
        s.tools, s.engine, s.settings.timings, "acme.refund", {"order": "O-9"}, by="alice"
    )
    assert failed["status"] == "failed" and failed["outcome"]["error"] == "KeyError: 'O-9'"
    doubt = adhoc_call(
        s.tools,
        s.engine,
        s.settings.timings,
        "acme.note",
        {"issue": "ENG-5", "body": "x"},
        by="alice",
    )
    assert doubt["status"] == "in_doubt"
    audit = stack.rows("SELECT detail FROM audit_events WHERE kind = 'tool.adhoc_call'")
    assert [a.detail["status"] for a in audit] == ["failed", "in_doubt"]
