"""What a run carries across a deploy besides its tools (issue 35, items 1 to 3), on real workers
running different code: a framework agent's instructions are pinned (a run is asked with the
ones it started with on every worker, or, following the latest, switches once, audited), and a
record written by newer code is handed back by an older worker (the run waits, never fails)
and served by a newer one. Judged from what the agent's model was sent and from Postgres."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support.desk_code import DESK_V1
from tests.support.drifts import drift_audits, until
from tests.support.scripts import call, final, step
from tests.support.user_modules import install, write_module

GUIDE = '''
import json
import os
import time

from pydantic_ai import Agent, messages
from pydantic_ai.models.function import AgentInfo, FunctionModel

from liyagent.adapters.pydantic_ai import durable


def respond(history: list[messages.ModelMessage], info: AgentInfo) -> messages.ModelResponse:
    """Records which code was asked with which instructions; looks twice, then answers."""
    with open(os.environ["GUIDE_SEEN"], "a") as seen:
        seen.write(json.dumps([{code!r}, history[-1].instructions]) + "\\n")
    looked = sum(
        isinstance(p, messages.ToolReturnPart) for m in history for p in getattr(m, "parts", [])
    )
    if looked < 2:
        time.sleep(float(os.environ.get("GUIDE_PAUSE_S", "0")))
        looking = messages.ToolCallPart("look", {{"q": "x"}}, f"c{{looked}}")
        return messages.ModelResponse(parts=[looking])
    return messages.ModelResponse(parts=[messages.TextPart("done")])


guide = Agent(FunctionModel(respond), name="guide", instructions={instructions!r})


@guide.tool_plain
def look(q: str) -> str:
    """Look something up."""
    return q


desk = durable(guide, name="guide", kinds={{"look": "read"}}, definition_policy={policy!r})
'''
OLD, NEW = "Answer in English.", "Answer in French."
# The next version of the desk: its lookup takes a region too (another argument schema).
REGIONS = DESK_V1.replace(
    "def lookup(ctx: CallContext, order: str)",
    'def lookup(ctx: CallContext, order: str, region: str = "eu")',
)
assert REGIONS != DESK_V1
# A liyagent release whose step records are of a newer format (3), reading the old one (2) too:
# what the next release's worker would write, loaded as its code.
NEWER_RECORDS = (
    DESK_V1
    + """
from runtime.durable import formats

formats.STEP_RECORD.writes = 3
formats.STEP_RECORD.reads = frozenset({2, 3})
"""
)


def _step(stack, run_id: str) -> int:
    return int(stack.rows("SELECT step FROM runs WHERE id = :r", r=run_id)[0].step)


def _attempt(stack, run_id: str) -> int:
    return int(stack.rows("SELECT attempt FROM runs WHERE id = :r", r=run_id)[0].attempt)


@pytest.mark.kill
@pytest.mark.parametrize("policy", ["pinned", "follow_latest"])
def test_a_framework_agents_instructions_are_pinned_across_a_deploy(
    stack, tmp_path: Path, monkeypatch, policy: str
) -> None:
    seen = tmp_path / "seen.jsonl"
    monkeypatch.setenv("GUIDE_SEEN", str(seen))
    site = tmp_path / "site"
    # Named for the policy: this process imports the old code, and a module once imported is
    # not read again.
    old_code, new_code = f"guide_{policy}_v1", f"guide_{policy}_v2"
    versions = {old_code: ("old", OLD), new_code: ("new", NEW)}
    source = {
        n: GUIDE.format(code=c, instructions=i, policy=policy) for n, (c, i) in versions.items()
    }
    install(stack, site, monkeypatch, **{old_code: source[old_code]})
    write_module(site, new_code, source[new_code])
    old = stack.worker("old", env={"GUIDE_SEEN": str(seen), "GUIDE_PAUSE_S": "1.5"})
    run_id = stack.client.start_agent("guide", "look twice")
    # The old code asks step 1 and, while step 2 is asked, its worker is replaced by one of the
    # new code (SIGTERM to its process group, as a service manager stops it: step 2 may be
    # lost with the pool's process and asked again, never written twice).
    until(lambda: seen.exists() and len(seen.read_text().splitlines()) >= 2, "no step 2")
    old.stop()
    stack.worker("new", env={"GUIDE_SEEN": str(seen), "LIYAGENT_TOOLS": new_code})
    view = stack.wait(run_id, timeout=60)
    assert view.status == "succeeded", view
    asked = [tuple(json.loads(line)) for line in seen.read_text().splitlines()]
    assert {code for code, _ in asked} == {"old", "new"}, asked
    drifts = drift_audits(stack, run_id)
    if policy == "pinned":
        # Every request of the run carries the instructions it started with, on either code.
        assert {said for _, said in asked} == {OLD}, asked
        assert drifts == []
    else:
        # Following the latest: the new code's from its first request on, once, audited.
        assert all(said == (OLD if code == "old" else NEW) for code, said in asked), asked
        [drift] = drifts
        assert drift["repinned"] != drift["pin"]
        assert [(c["what"], c["change"]) for c in drift["changes"]] == [("agent", "instructions")]


@pytest.mark.kill
def test_an_older_worker_hands_back_a_run_whose_records_newer_code_wrote(
    stack, tmp_path: Path, monkeypatch
) -> None:
    site = tmp_path / "site"
    install(stack, site, monkeypatch, desk_v1=DESK_V1)
    write_module(site, "desk_newer", NEWER_RECORDS)
    newer = {"LIYAGENT_TOOLS": "desk_newer"}
    first = stack.worker("newer", env=newer)
    lookup = call("toolu_1", "desk.lookup", order="A-1")
    steps = [step(lookup), step(lookup, latency_ms=3000), final("looked up")]
    run_id = stack.client.start_run(
        agent="desk",
        model={"provider": "scripted", "script": {"steps": steps}},
        user_input="look A-1 up twice",
        tools=["desk.lookup"],
    )
    # Newer code writes step 1 (a record of format 3), then its worker goes away mid-step 2.
    until(lambda: _step(stack, run_id) >= 1, "step 1 was never written")
    first.stop()
    # Its wait is short, yet an older worker never fails a run newer code took.
    older = stack.worker("older", env={"LIYAGENT_DEFINITION_WAIT_S": "1"})
    until(lambda: stack.client.get(run_id).status == "waiting", "the older worker never gave it")
    view = stack.client.get(run_id)
    assert view.waiting_on is not None and view.waiting_on.startswith("definition:newer:")
    [drift] = drift_audits(stack, run_id)
    [change] = drift["changes"]
    assert (change["name"], change["change"], change["now"]) == ("step record", "format", "3")
    assert drift["waits_for"] == "newer_code"
    # Retried past its wait (2 s, then more), it still waits.
    until(lambda: _attempt(stack, run_id) >= 3, "it was not retried", timeout=20)
    assert stack.client.get(run_id).status in ("waiting", "queued", "running")
    older.stop()
    stack.worker("newer-again", env=newer)
    view = stack.wait(run_id, timeout=60)
    assert view.status == "succeeded", view
    assert drift_audits(stack, run_id)[-1]["waited_s"] > 0


@pytest.mark.kill
@pytest.mark.parametrize("then", ["a newer worker comes", "rolled back"])
def test_a_follower_is_taken_back_to_older_code_only_after_its_wait(
    stack, tmp_path: Path, monkeypatch, then: str
) -> None:
    site = tmp_path / "site"
    install(stack, site, monkeypatch, desk_v1=DESK_V1)
    write_module(site, "desk_v2", REGIONS)
    lookup = call("toolu_1", "desk.lookup", order="A-1")
    steps = [step(lookup), step(lookup, latency_ms=3000), final("looked up")]
    # The old code's workers ran before the new code's (a worker notes its code's version when
    # it starts: the older one); the run is started on the old code, taken by a new worker.
    stack.worker("old-before", runs=False).stop()
    run_id = stack.client.start_run(
        agent="desk",
        model={"provider": "scripted", "script": {"steps": steps}},
        user_input="look A-1 up twice",
        tools=["desk.lookup", "desk.refund"],
        definition_policy="follow_latest",
    )
    new = {"LIYAGENT_TOOLS": "desk_v2"}
    first = stack.worker("new", env=new)
    # The new code re-pins it and writes step 1; its worker goes away mid-step 2, and a worker
    # of the old code (still up mid-deploy), which does not serve the new pin, takes the run:
    # it waits for newer code instead of taking it back to its own.
    until(lambda: _step(stack, run_id) >= 1, "step 1 was never written")
    first.stop()
    wait_s = "900" if then == "a newer worker comes" else "3"
    old = stack.worker("old", env={"LIYAGENT_DEFINITION_WAIT_S": wait_s})
    until(lambda: len(drift_audits(stack, run_id)) >= 2, "the old worker never gave it")
    repinned, waiting = drift_audits(stack, run_id)[:2]
    assert repinned["policy"] == "follow_latest" and "repinned" in repinned
    assert waiting["waits_for"] == "newer_code" and waiting["pin"] == repinned["repinned"]
    if then == "a newer worker comes":
        old.stop()
        stack.worker("new-again", env=new)
    view = stack.wait(run_id, timeout=60)
    assert view.status == "succeeded", view
    last = drift_audits(stack, run_id)[-1]
    if then == "a newer worker comes":
        assert last["served"] == repinned["repinned"]
    else:
        # No newer worker took it within its wait: the code that remains takes it, audited.
        assert last["repinned"] == repinned["pin"] and last["back_after_s"] >= 3
