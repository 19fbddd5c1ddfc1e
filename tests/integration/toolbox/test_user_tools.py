"""A user's tool module that lives outside the repository (written into the test's directory,
found through PYTHONPATH, named by LIYAGENT_TOOLS), async tools among them, crash-tested on real
workers: a SIGKILLed worker's run resumes and every write is settled by its declared kind.
Judged by the vendor simulator's own records."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from tests.support.scripts import call, final, step
from tests.support.user_modules import install

MODULE = "acme_support_tools"
SOURCE = textwrap.dedent(
    '''
    """Acme's own support tools: they know nothing of liyagent but its public surface."""

    import os
    from typing import Any

    from liyagent import CallContext, tool


    def url(path: str) -> str:
        return os.environ["LIYAGENT_VENDOR_URL"].rstrip("/") + path


    @tool.read(name="acme.ticket")
    async def ticket(ctx: CallContext, ticket: str) -> dict[str, Any]:
        """Read a support ticket."""
        response = await ctx.http.aget(url(f"/tickets/{ticket}"))
        response.raise_for_status()
        return response.json()


    @tool.keyed_write(name="acme.incident", dedupe_window_s=86400)
    async def incident(ctx: CallContext, title: str) -> dict[str, Any]:
        """Open an incident (the tracker dedupes on the key for a day)."""
        body = {"title": title, "severity": "sev2"}
        response = await ctx.http.apost(url("/incidents"), json=body)
        response.raise_for_status()
        return response.json()


    @tool.write(name="acme.comment")
    def comment(ctx: CallContext, issue: str, body: str) -> dict[str, Any]:
        """Comment on an engineering issue."""
        response = ctx.http.post(url(f"/issues/{issue}/comments"), json={"body": body})
        response.raise_for_status()
        return response.json()


    @comment.read_back
    async def find_comment(ctx: CallContext, issue: str, body: str) -> dict[str, Any] | None:
        response = await ctx.http.aget(url("/comments"), params={"key": ctx.key})
        response.raise_for_status()
        found = response.json()
        return found[0] if found else None


    @tool.write(name="acme.reply")
    async def reply(ctx: CallContext, conversation: str, text: str) -> dict[str, Any]:
        """Reply to the customer in chat."""
        body = {"conversation": conversation, "text": text, "cards": []}
        response = await ctx.http.apost(url("/chat/replies"), json=body)
        response.raise_for_status()
        return response.json()
    '''
)
STEPS = [
    step(
        call("toolu_u_t", "acme.ticket", ticket="T-7"),
        call("toolu_u_i", "acme.incident", title="Checkout down"),
    ),
    step(call("toolu_u_c", "acme.comment", issue="ENG-7", body="Investigating")),
    step(call("toolu_u_r", "acme.reply", conversation="conv-7", text="On it")),
    final("Handled T-7."),
]


@pytest.fixture
def user_module(stack, tmp_path: Path, monkeypatch) -> None:
    """The module written where only PYTHONPATH finds it, and named in LIYAGENT_TOOLS for every
    process started from now on (this one too)."""
    install(stack, tmp_path / "acme", monkeypatch, **{MODULE: SOURCE})


def vendor_counts(stack, run_id: str) -> tuple[int, int, int]:
    """Incidents, comments and chat replies the vendors made for the run, by their records."""
    sql = (
        "SELECT count(*) AS n FROM sim.{table} t WHERE t.idem_key IN "
        "(SELECT idem_key FROM sim.requests WHERE run_id = :r)"
    )
    return tuple(  # type: ignore[return-value]
        stack.vendor(sql.format(table=t), r=run_id)[0].n
        for t in ("incidents", "comments", "chat_replies")
    )


def test_a_user_module_outside_the_repo_runs_async_tools(stack, user_module) -> None:
    stack.worker()
    run_id = stack.start(STEPS)
    view = stack.wait(run_id)
    assert view.status == "succeeded", view
    assert vendor_counts(stack, run_id) == (1, 1, 1)
    assert stack.told_by_tool(run_id, 2)["acme.ticket"]["id"] == "T-7"
    kinds = stack.rows(
        "SELECT tool, kind FROM call_marks WHERE run_id = :r ORDER BY step, call_index", r=run_id
    )
    assert [(k.tool, k.kind) for k in kinds] == [
        ("acme.incident", "keyed_write"),
        ("acme.comment", "write"),
        ("acme.reply", "write"),
    ]


@pytest.mark.kill
@pytest.mark.parametrize(
    ("fault", "counts", "settled"),
    [
        ("after_send:kill", (1, 1, 1), ("acme.incident", "resent")),  # async keyed write
        ("after_send:kill:2", (1, 1, 1), ("acme.comment", "read_back")),  # async reader found it
        ("after_mark:kill:3", (1, 1, 0), ("acme.reply", "unknown")),  # async plain write
    ],
    ids=["keyed-async", "reader-async", "plain-async"],
)
def test_a_user_module_is_crash_tested_on_real_workers(
    stack, user_module, fault, counts, settled
) -> None:
    run_id = stack.kill_then_resume(fault, lambda: stack.start(STEPS))
    view = stack.wait(run_id)
    assert view.status == "succeeded", view
    assert view.lost_count == 1
    assert vendor_counts(stack, run_id) == counts
    [resumed] = stack.rows(
        "SELECT detail FROM audit_events WHERE run_id = :r AND kind = 'agent.run.crash_resumed'",
        r=run_id,
    )
    assert settled in [(c["tool"], c["settled"]) for c in resumed.detail["calls"]]
    creates = stack.vendor(
        "SELECT idem_key, deduped FROM sim.requests WHERE run_id = :r AND vendor = 'incidents' "
        "AND method = 'POST' ORDER BY id",
        r=run_id,
    )
    assert len({c.idem_key for c in creates}) == 1  # one key, however often it was sent
    assert [c.deduped for c in creates][1:] == [True] * (len(creates) - 1)
