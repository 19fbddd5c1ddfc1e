"""Erasure: a run's content (or every run of an owner) is deleted at once and a tombstone kept,
with its status and an audit row naming who erased it; a run in flight is stopped and fenced
out first and writes nothing after; bad input is refused (CLI exit 2, front 404/400/403)."""

from __future__ import annotations

import json
import time
import uuid
import warnings
from dataclasses import replace

import pytest
from starlette.exceptions import StarletteDeprecationWarning

from front.app import create_app
from front.auth import token_digest
from runtime import services as runtime_services
from store.schema import metadata
from tests.integration.cli.test_cli import cli, out_json
from tests.support.recorded import Reply, recorded_servers
from tests.support.scripts import call, final, step

with warnings.catch_warnings():
    warnings.simplefilter("ignore", StarletteDeprecationWarning)
    from starlette.testclient import TestClient

RUN_TABLES = sorted(t.name for t in metadata.tables.values() if "run_id" in t.c)


def _secret_run(
    stack, secret: str, owner: str = "app", latency_ms: int = 0, scripted: bool = False
) -> str:
    """A run whose input, tool arguments and answer all carry `secret` (and, `scripted`, its
    definition too: the script rides in the run's spec)."""
    steps = [
        step(call(f"toolu_{secret}", "incident.create", title=f"{secret}-title"),
             latency_ms=latency_ms),
        final(f"{secret}-answer"),
    ]  # fmt: skip
    model = {"provider": "scripted", "script": {"steps": steps}} if scripted else stack.model(steps)
    return stack.client.start_run(
        agent="support-bot", model=model, user_input=f"{secret}-input", owner=owner,
        system=f"{secret}-system", tools=["incident.create"],
    )  # fmt: skip


def _mentions(stack, secret: str) -> dict[str, int]:
    """Rows of every table whose text mentions `secret` (only nonzero counts)."""
    found = {}
    for table in sorted(metadata.tables):
        n = stack.rows(f"SELECT count(*) AS n FROM {table} t WHERE t::text LIKE :s",
                       s=f"%{secret}%")[0].n  # fmt: skip
        if n:
            found[table] = n
    return found


def _content_left(stack, run_id: str) -> dict[str, object]:
    """What erasure must leave empty: the run's sealed content, its transcript, what its tools
    answered and the arguments of its approvals (the marks and decided approvals stay, empty:
    the run's events are derived from them)."""
    [run] = stack.rows("SELECT checkpoint, answer, input FROM runs WHERE id = :r", r=run_id)
    left: dict[str, object] = {
        "checkpoint": run.checkpoint, "answer": run.answer, "input": run.input,
    }  # fmt: skip
    for name, query in (
        ("mark_outcomes", "SELECT count(*) AS n FROM call_marks WHERE run_id = :r "
                          "AND outcome IS NOT NULL"),
        ("transcript_messages", "SELECT count(*) AS n FROM transcript_messages WHERE run_id = :r"),
        ("approval_content", "SELECT count(*) AS n FROM approvals WHERE run_id = :r "
                             "AND (args <> '{}'::jsonb OR reason IS NOT NULL)"),
    ):  # fmt: skip
        left[name] = stack.rows(query, r=run_id)[0].n
    return left


EMPTY = {"checkpoint": None, "answer": None, "input": "", "mark_outcomes": 0,
         "transcript_messages": 0, "approval_content": 0}  # fmt: skip


def _erased_audit(stack, run_id: str) -> list[dict]:
    rows = stack.rows(
        "SELECT detail FROM audit_events WHERE run_id = :r AND kind = 'agent.run.erased'", r=run_id
    )
    return [r.detail for r in rows]


def test_erasing_a_finished_run_leaves_a_tombstone_and_no_content(stack) -> None:
    stack.worker("w1")
    secret = f"s{uuid.uuid4().hex[:10]}"
    run_id = _secret_run(stack, secret, scripted=True)
    assert stack.wait(run_id).status == "succeeded"
    with stack.db() as conn:  # its entry rows, as A2A and Teams keep them
        conn.exec_driver_sql(
            "INSERT INTO a2a_tasks (id, run_id, status, answer, message) VALUES "
            "(%(t)s, %(r)s, 'completed', %(a)s, CAST(%(m)s AS jsonb))",
            {"t": f"task-{uuid.uuid4().hex[:8]}", "r": run_id, "a": f"{secret}-answer",
             "m": json.dumps({"text": f"{secret}-input"})},
        )  # fmt: skip
        conn.exec_driver_sql(
            "INSERT INTO teams_inbox (message_id, conversation, sender_id, agent, text, status, "
            "run_id, reply) VALUES ('m1', 'c1', '0b0a0000-0000-0000-0000-00000000a11e', "
            "'support-bot', %(i)s, 'replied', %(r)s, CAST(%(a)s AS jsonb))",
            {"i": f"{secret}-input", "r": run_id, "a": json.dumps({"text": f"{secret}-answer"})},
        )
    assert _mentions(stack, secret)  # the content is there before

    before = stack.client.events(run_id).events
    done = out_json(cli("erase", "--run", run_id[:8], "--by", "dpo", "--json", env=stack.env))
    assert done == {"erased": [{"run_id": run_id, "status": "succeeded"}], "stopped": [],
                    "by": "dpo"}  # fmt: skip
    assert _mentions(stack, secret) == {}
    assert _content_left(stack, run_id) == EMPTY
    [tomb] = stack.rows("SELECT status, agent, owner, definition FROM runs WHERE id = :r", r=run_id)
    assert (tomb.status, tomb.agent, tomb.owner) == ("succeeded", "support-bot", "app")
    assert tomb.definition is None  # its sealed definition went with the rest
    assert _erased_audit(stack, run_id) == [{"by": "dpo", "status": "succeeded"}]
    # Its events are the same, seq for seq: a follower's Last-Event-ID still means what it did.
    assert [(e.seq, e.kind) for e in stack.client.events(run_id).events] == [
        (e.seq, e.kind) for e in before
    ]
    # The entry rows stay, empty, so a message sent again is still the same (erased) task.
    assert stack.rows("SELECT count(*) AS n FROM a2a_tasks WHERE run_id = :r", r=run_id)[0].n
    status = cli("status", run_id, "--json", env=stack.env)
    assert status.returncode == 0 and json.loads(status.stdout)["status"] == "succeeded"


def test_erasing_by_owner_erases_only_that_owners_runs(stack) -> None:
    stack.worker("w1")
    mine = [f"s{uuid.uuid4().hex[:10]}" for _ in range(2)]
    theirs = f"s{uuid.uuid4().hex[:10]}"
    mine_ids = [_secret_run(stack, s, owner="alice") for s in mine]
    theirs_id = _secret_run(stack, theirs, owner="bob")
    for run_id in [*mine_ids, theirs_id]:
        assert stack.wait(run_id).status == "succeeded"
    done = cli("erase", "--owner", "alice", "--by", "dpo", env=stack.env)
    assert done.returncode == 0, done.stderr
    assert all(run_id in done.stdout for run_id in mine_ids)
    for secret, run_id in zip(mine, mine_ids, strict=True):
        assert _mentions(stack, secret) == {}
        assert _content_left(stack, run_id) == EMPTY
        assert _erased_audit(stack, run_id) == [{"by": "dpo", "status": "succeeded"}]
    assert _mentions(stack, theirs)  # bob's run is untouched
    assert _erased_audit(stack, theirs_id) == []


def test_erasing_a_running_run_stops_it_first_and_nothing_is_written_after(stack) -> None:
    worker = stack.worker("w1")
    secret = f"s{uuid.uuid4().hex[:10]}"
    run_id = _secret_run(stack, secret, latency_ms=1500)  # the model answers slowly
    deadline = time.monotonic() + 30
    while stack.client.get(run_id).status != "running":
        assert time.monotonic() < deadline
        time.sleep(0.02)
    before = stack.client.events(run_id).events
    done = stack.client.erase(run_id=run_id, by="dpo")
    assert done.stopped == [run_id] and done.runs == [(run_id, "failed")]
    # The events a follower had keep their seqs; the run's end follows them.
    after = [(e.seq, e.kind) for e in stack.client.events(run_id).events]
    assert after[: len(before)] == [(e.seq, e.kind) for e in before], after
    assert after[-1][1] == "failed" and len(after) > len(before), after
    # The attempt in flight finishes its model step, tries to write its checkpoint, and is
    # fenced out: nothing of it lands.
    worker.wait_for(r"run\.fenced_out", timeout=30)
    time.sleep(0.5)
    assert _content_left(stack, run_id) == EMPTY
    assert _mentions(stack, secret) == {}
    assert stack.vendor_writes(run_id) == []
    [run] = stack.rows("SELECT status, attempt, failure_reason, step FROM runs WHERE id = :r",
                       r=run_id)  # fmt: skip
    assert (run.status, run.attempt, run.failure_reason, run.step) == (
        "failed", 2, "erased by dpo", 0,
    )  # fmt: skip
    kinds = [r.kind for r in stack.rows(
        "SELECT kind FROM audit_events WHERE run_id = :r ORDER BY id", r=run_id)]  # fmt: skip
    assert kinds == ["agent.stop.created", "agent.run.failed", "agent.run.erased"]


def _front(stack, rights: list[str]):
    tokens = {"tokens": [{"principal": "dpo", "sha256": token_digest("t-dpo"), "rights": rights}]}
    settings = replace(stack.settings, front_tokens=json.dumps(tokens))
    services = runtime_services.build(settings, stack.services.publisher, sealer=stack.sealer)
    return services, TestClient(create_app(services), headers={"Authorization": "Bearer t-dpo"})


@pytest.mark.parametrize("surface", ["cli", "front"])
def test_bad_input_is_refused_and_nothing_is_erased(stack, surface: str) -> None:
    stack.worker("w1")
    secret = f"s{uuid.uuid4().hex[:10]}"
    run_id = _secret_run(stack, secret)
    assert stack.wait(run_id).status == "succeeded"
    unknown = str(uuid.uuid4())
    if surface == "cli":
        for args, said in (
            (["--run", unknown], f"run {unknown} does not exist"),
            (["--run", "not-a-run"], "is not a valid run id"),
            (["--owner", "nobody"], "no run has owner 'nobody'"),
        ):
            done = cli("erase", *args, "--by", "dpo", env=stack.env)
            assert done.returncode == 2 and said in done.stderr, (args, done.stderr)
            assert "Traceback" not in done.stderr
        missing_by = cli("erase", "--run", run_id, env=stack.env)
        assert missing_by.returncode == 2
    else:
        services, front = _front(stack, ["stop"])
        with front:
            refused = front.post(f"/runs/{run_id}/erase", json={})
            assert refused.status_code == 403 and "erase" in refused.text
        services.redis.close()
        services, front = _front(stack, ["erase"])
        with front:
            assert front.post(f"/runs/{unknown}/erase", json={}).status_code == 404
            assert front.post("/runs/not-a-uuid/erase", json={}).status_code == 400
            assert front.post("/owners/nobody/erase", json={}).status_code == 404
            named = front.post(f"/runs/{run_id}/erase", json={"by": "someone else"})
            assert named.status_code == 400
            assert _mentions(stack, secret)  # nothing erased yet
            ok = front.post("/owners/app/erase", json={})
            assert ok.status_code == 200, ok.text
            assert ok.json()["by"] == "dpo" and ok.json()["erased"] == [
                {"run_id": run_id, "status": "succeeded"}
            ]
        services.redis.close()
        assert _erased_audit(stack, run_id) == [{"by": "dpo", "status": "succeeded"}]
        return
    assert _mentions(stack, secret) and _erased_audit(stack, run_id) == []


def test_erasing_a_run_waiting_on_an_approval_fails_it_and_drops_the_held_call(stack) -> None:
    stack.worker("w1")
    secret = f"s{uuid.uuid4().hex[:10]}"
    steps = [step(call("toolu_p1", "incident.page", title=f"{secret}-title", severity="sev1")),
             final(f"{secret}-answer")]  # fmt: skip
    run_id = stack.client.start_run(
        agent="support-bot",
        model=stack.model(steps),
        user_input=f"{secret}-input",
        tools=["incident.page"],
    )
    stack.client.wait(run_id, timeout_s=60, until=frozenset({"waiting"}))
    [held] = stack.client.approvals(run_id)
    done = stack.client.erase(run_id=run_id, by="dpo")
    assert done.stopped == [run_id] and done.runs == [(run_id, "failed")]
    assert _content_left(stack, run_id) == EMPTY and _mentions(stack, secret) == {}
    [run] = stack.rows("SELECT status, waiting_on, failure_reason FROM runs WHERE id = :r",
                       r=run_id)  # fmt: skip
    assert (run.status, run.waiting_on, run.failure_reason) == (
        "failed", None, "stopped by dpo: erasure",
    )  # fmt: skip
    late = cli("approve", held.id, "--by", "lee", env=stack.env)  # the held call is gone
    assert late.returncode == 1 and "does not exist" in late.stderr
    assert stack.client.get(run_id).status == "failed" and stack.vendor_writes(run_id) == []


def _bytes_left(stack, run_ids: list[str]) -> dict[str, int]:
    """Rows of the runs still holding sealed bytes (every bytea column of every table naming
    them): sealed content is encrypted, so a text search cannot see it, but the deployment's
    key opens it; erasure must leave none."""
    columns = stack.rows(
        "SELECT table_name, column_name FROM information_schema.columns "
        "WHERE table_schema = 'public' AND data_type = 'bytea'"
    )
    left = {}
    for c in columns:
        key = "id" if c.table_name == "runs" else "run_id"
        if key not in metadata.tables[c.table_name].c:
            continue
        n = stack.rows(
            f"SELECT count(*) AS n FROM {c.table_name} WHERE {key} = ANY(CAST(:ids AS uuid[])) "
            f"AND {c.column_name} IS NOT NULL AND length({c.column_name}) > 0",
            ids=run_ids,
        )[0].n
        if n:
            left[f"{c.table_name}.{c.column_name}"] = n
    return left


def _redis_mentions(stack, needle: str) -> list[str]:
    """Keys of this test's Redis namespace whose value mentions `needle` (every type)."""
    client = stack.services.redis
    found = []
    for key in client.scan_iter(match=f"{stack.settings.namespace}*", count=500):
        kind = client.type(key).decode()
        if kind == "string":
            values = [client.get(key) or b""]
        elif kind == "hash":
            values = [k + v for k, v in client.hgetall(key).items()]
        elif kind == "list":
            values = client.lrange(key, 0, -1)
        elif kind == "set":
            values = list(client.smembers(key))
        elif kind == "zset":
            values = [m for m, _ in client.zrange(key, 0, -1, withscores=True)]
        else:
            values = [client.dump(key) or b""]
        if any(needle.encode() in v for v in values):
            found.append(key.decode())
    return found


def test_erasure_leaves_no_byte_of_content_anywhere(stack, tmp_path) -> None:
    """The probe's search: an owner's runs whose input, tool arguments and results, approval
    reason and provider error all carry one canary; after `erase --owner`, no column of any
    table and no key of Redis holds it, and no sealed byte of the runs is left to open."""
    canary = f"cnry{uuid.uuid4().hex[:12]}"
    owner = "erasable-owner"
    fixtures = tmp_path / "fixtures"
    fixtures.mkdir()
    body = {"error": {"message": f"cannot take {canary}-prompt (key sk-{canary}0123456789)",
                      "type": "invalid_request_error"}}  # fmt: skip
    (fixtures / "canary_400.json").write_text(json.dumps(body))
    with recorded_servers(fixtures, "/v1") as serve:
        provider = serve(Reply("canary_400", status=400))
        stack.declare_model("erring", "openai", provider.base_url, "OPENAI_API_KEY")
        stack.worker("w1", env={"OPENAI_API_KEY": "worker-key"})
        failed = stack.client.start_run(
            agent="support-bot", model={"profile": "erring", "model": "m"},
            user_input=f"{canary}-failed-input", owner=owner,
        )  # fmt: skip
        steps = [
            step(call(f"toolu_{canary}_r", "ticket.read", ticket=f"T-{canary}"),
                 call(f"toolu_{canary}_p", "incident.page", title=f"{canary}-title")),
            final(f"{canary}-answer"),
        ]  # fmt: skip
        paged = stack.client.start_run(
            agent="support-bot", model=stack.model(steps), user_input=f"{canary}-input",
            owner=owner, system=f"{canary}-system", tools=["ticket.read", "incident.page"],
        )  # fmt: skip
        held = stack.client.start_run(
            agent="support-bot", model=stack.model(steps), user_input=f"{canary}-held",
            owner=owner, tools=["ticket.read", "incident.page"],
        )  # fmt: skip
        stack.client.wait(held, timeout_s=60, until=frozenset({"waiting"}))
        stack.client.stop(run_id=held, reason=f"stopped: {canary}-stop", by="ops")
        stack.client.wait(paged, timeout_s=60, until=frozenset({"waiting"}))
        [request] = stack.client.approvals(paged)
        stack.client.decide(request.id, approve=True, by="alice", reason=f"ok {canary}-why")
        assert stack.wait(paged).status == "succeeded"
        assert stack.wait(failed).status == "failed"
    before = _mentions(stack, canary)
    assert {"runs", "transcript_messages", "approvals", "stops"} <= set(before), before
    assert _bytes_left(stack, [failed, paged])
    done = out_json(cli("erase", "--owner", owner, "--by", "dpo", "--json", env=stack.env))
    assert sorted(r["run_id"] for r in done["erased"]) == sorted([failed, paged, held])
    assert _mentions(stack, canary) == {}
    assert _bytes_left(stack, [failed, paged, held]) == {}
    assert _redis_mentions(stack, canary) == []
    # The tombstone: status, owner and the failure's code, nothing of its text.
    [tomb] = stack.rows("SELECT status, owner, failure_reason FROM runs WHERE id = :r", r=failed)
    assert (tomb.status, tomb.owner) == ("failed", owner)
    assert tomb.failure_reason == "failed: model_error; its reason was erased"
