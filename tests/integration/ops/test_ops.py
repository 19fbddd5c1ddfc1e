"""Operations a new user hit: lifting a Stop, one rule for agent names, run id prefixes, job
parameters checked at enqueue, failures that add up by code, stopped waiting runs, denied
calls, request keys that name another request, reads that never make a seal key, bad URLs,
and user text kept out of logs and audit rows."""

from __future__ import annotations

import json
import os
import uuid
from pathlib import Path

import pytest
import sqlalchemy as sa

from runtime.entries.client import BadRequest, RequestConflict
from store import views
from tests.integration.cli.test_cli import cli, out_json, run_count
from tests.support.scripts import call, final, step
from tests.support.stored_runs import stored_run

PAGE = [
    step(call("toolu_p1", "incident.page", title="Checkout down", severity="sev1")),
    final("Paged."),
]


def _script(tmp_path: Path, steps: list[dict] | None = None) -> str:
    path = tmp_path / f"script-{uuid.uuid4().hex[:6]}.json"
    path.write_text(json.dumps({"steps": steps or [final("Done.")]}))
    return str(path)


def _run(stack, tmp_path: Path, agent: str, *extra: str, script: str | None = None):
    return cli(
        "run", "--agent", agent, "--script", script or _script(tmp_path), "--input", "go",
        *extra, env=stack.env,
    )  # fmt: skip


def _started(done) -> str:
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_an_agent_stop_is_lifted_and_its_runs_go_on(stack, tmp_path: Path) -> None:
    queued = _started(_run(stack, tmp_path, "pager"))
    stopped = cli("stop", "--agent", "pager", "--reason", "bad deploy", "--by", "ops",
                  env=stack.env)  # fmt: skip
    assert stopped.returncode == 0 and queued in stopped.stdout, stopped.stderr
    stack.worker("w1")
    refused = _started(_run(stack, tmp_path, "pager"))
    view = stack.wait(refused)
    assert (view.status, view.failure_reason) == ("failed", "stopped by ops: bad deploy")
    lifted = out_json(cli("stop", "--lift", "--agent", "pager", "--by", "lee", "--json",
                          env=stack.env))  # fmt: skip
    [stop] = stack.rows("SELECT id, lifted_at, lifted_by FROM stops")
    assert lifted["lifted"] == [stop.id] and stop.lifted_by == "lee" and stop.lifted_at
    [audit] = stack.rows("SELECT run_id, detail FROM audit_events WHERE kind = 'agent.stop.lifted'")
    assert audit.run_id is None
    assert (audit.detail["agent"], audit.detail["by"], audit.detail["stopped_by"]) == (
        "pager", "lee", "ops",
    )  # fmt: skip
    assert stack.wait(_started(_run(stack, tmp_path, "pager"))).status == "succeeded"
    again = cli("stop", "--lift", "--agent", "pager", "--by", "lee", env=stack.env)
    assert again.returncode == 1 and "no stop stands on agent pager" in again.stderr


def test_agent_names_follow_one_rule_and_unknown_agents_are_not_stopped(
    stack, tmp_path: Path
) -> None:
    for name in ("bad name", "a:b", "", "x" * 201):
        done = _run(stack, tmp_path, name)
        assert done.returncode == 2 and "agent name" in done.stderr, (name, done.stderr)
    workflow = tmp_path / "wf.json"
    workflow.write_text(json.dumps({"start": "a", "steps": {"a": {"tool": "ticket.read",
                                    "args": {"ticket": "T"}, "next": None}}}))  # fmt: skip
    named = cli("workflow", "--name", "two words", "--file", str(workflow), env=stack.env)
    assert named.returncode == 2 and "workflow name" in named.stderr
    assert run_count(stack) == 0
    ghost = cli("stop", "--agent", "ghost", "--reason", "r", "--by", "o", env=stack.env)
    assert ghost.returncode == 2 and "no agent named 'ghost'" in ghost.stderr
    bad = cli("stop", "--agent", "a:b", "--reason", "r", "--by", "o", env=stack.env)
    assert bad.returncode == 2 and "agent name" in bad.stderr
    assert stack.rows("SELECT count(*) AS n FROM stops")[0].n == 0
    _started(_run(stack, tmp_path, "has-runs"))  # an agent with runs may be stopped
    done = cli("stop", "--agent", "has-runs", "--reason", "r", "--by", "o", env=stack.env)
    assert done.returncode == 0, done.stderr


def _insert(stack, run_id: str) -> None:
    stored_run(stack, "prefixed", run_id=run_id)


def test_a_unique_run_id_prefix_names_its_run(stack) -> None:
    twins = [f"0badc0de-0000-4000-8000-00000000000{i}" for i in (1, 2)]
    single = "0badbeef-0000-4000-8000-000000000003"
    for run_id in [*twins, single]:
        _insert(stack, run_id)
    found = out_json(cli("status", "0badbeef", "--json", env=stack.env))
    assert found["run_id"] == single
    human = cli("status", single[:8], env={**stack.env, "COLUMNS": "60"})
    assert human.returncode == 0 and single in human.stdout, human.stderr
    ambiguous = cli("status", "0badc0de", env=stack.env)
    assert ambiguous.returncode == 2 and "ambiguous" in ambiguous.stderr
    assert all(t in ambiguous.stderr for t in twins) and single not in ambiguous.stderr
    assert cli("status", "0bad", env=stack.env).returncode == 2
    missing = cli("status", "ffff0000", env=stack.env)
    assert missing.returncode == 1 and "does not exist" in missing.stderr
    assert cli("status", "0ba", env=stack.env).returncode == 2  # too short to be a prefix
    assert cli("inspect", "0badbe", "--json", env=stack.env).returncode == 0
    stopped = out_json(cli("stop", "--run", "0badbeef-0", "--reason", "r", "--by", "o", "--json",
                           env=stack.env))  # fmt: skip
    assert stopped["stopped_now"] == [single]
    assert out_json(cli("approvals", "0badbeef", "--json", env=stack.env)) == []


def test_job_parameters_are_checked_before_anything_is_stored(stack) -> None:
    done = cli("job", "source_sync", "--params", "{}", env=stack.env)
    assert done.returncode == 2 and "source: Field required" in done.stderr, done.stderr
    assert "nothing was stored" in done.stderr
    with pytest.raises(BadRequest, match="page_size"):
        stack.client.start_job(kind="source_sync", params={"source": "dir:/x", "page_size": 0})
    assert run_count(stack) == 0


def test_every_failed_run_has_a_failure_code(stack, tmp_path: Path) -> None:
    for _ in range(2):
        _started(_run(stack, tmp_path, "pager"))
    one = _started(_run(stack, tmp_path, "other"))
    cli("stop", "--run", one, "--reason", "r", "--by", "o", env=stack.env)
    cli("stop", "--agent", "pager", "--reason", "r", "--by", "o", env=stack.env)
    with stack.db() as conn:
        failed = sum(c.n for c in views.run_counts(conn) if c.status == "failed")
        codes = views.failures_by_code(conn)
    assert failed == 3 and codes == {"stopped": 3}


def test_a_stopped_waiting_run_clears_its_wait_and_a_denied_call_is_settled_denied(
    stack,
) -> None:
    stack.worker("w1")
    waiting = stack.start(PAGE)
    stack.client.wait(waiting, timeout_s=60, until=frozenset({"waiting"}))
    assert stack.client.stop(run_id=waiting, reason="r", by="o") == [waiting]
    view = stack.client.get(waiting)
    assert (view.status, view.waiting_on) == ("failed", None)
    denied = stack.start(PAGE)
    stack.client.wait(denied, timeout_s=60, until=frozenset({"waiting"}))
    [request] = stack.client.approvals(denied)
    stack.client.decide(request.id, approve=False, by="dave", reason="no")
    assert stack.wait(denied).status == "succeeded"
    [resumed] = stack.rows(
        "SELECT detail FROM audit_events WHERE run_id = :r AND kind = 'agent.run.resumed'",
        r=denied,
    )
    assert [c["settled"] for c in resumed.detail["calls"]] == ["denied"]


def test_a_request_key_names_one_request(stack, tmp_path: Path) -> None:
    model = {"provider": "scripted", "script": {"steps": [final("Done.")]}}

    def start(text: str) -> str:
        return stack.client.start_run(
            agent="keyed", model=model, user_input=text, request_key="ticket-4711"
        )

    first = start("checkout errors")
    assert start("checkout errors") == first
    with pytest.raises(RequestConflict) as caught:
        start("something else")
    assert caught.value.run_id == first
    [stored] = [r.request_digest for r in stack.rows("SELECT request_digest FROM runs")]
    assert stored not in str(caught.value)  # never a digest of the first request's input
    script = _script(tmp_path)
    again = [_run(stack, tmp_path, "keyed2", "--request-key", "k2", script=script)
             for _ in range(2)]  # fmt: skip
    assert _started(again[0]) == _started(again[1])
    other = cli("run", "--agent", "keyed2", "--script", script, "--input", "other",
                "--request-key", "k2", env=stack.env)  # fmt: skip
    assert other.returncode == 2 and "other parameters" in other.stderr
    [row] = stack.rows("SELECT request_digest FROM runs WHERE request_key = 'k2'")
    assert row.request_digest not in other.stderr
    assert run_count(stack) == 2


def test_reads_never_make_a_seal_key(stack, tmp_path: Path) -> None:
    stack.worker("w1")
    run_id = stack.start([final("Done.")])
    assert stack.wait(run_id).status == "succeeded"
    keyfile = tmp_path / "dev-keys"
    env = {k: v for k, v in stack.env.items() if k != "LIYAGENT_SEAL_KEYS"}
    env |= {"LIYAGENT_DEV_SEAL_FILE": str(keyfile), "LIYAGENT_ENV": "development"}
    listing = cli("status", env=env)
    assert listing.returncode == 0 and run_id in listing.stdout, listing.stderr
    one = out_json(cli("status", run_id, "--json", env=env))
    assert one["status"] == "succeeded" and one["answer"] is None
    assert "no seal keys here" in one["answer_error"] and str(keyfile) in one["answer_error"]
    assert cli("approvals", run_id, env=env).returncode == 0
    inspect = cli("inspect", run_id, env=env)
    assert inspect.returncode == 2 and "no seal keys here" in inspect.stderr
    assert not keyfile.exists()
    assert (
        stack.rows("SELECT count(*) AS n FROM audit_events WHERE kind LIKE '%unverified'")[0].n == 0
    )


def test_bad_urls_exit_2_without_a_traceback() -> None:
    env = {**os.environ, "LIYAGENT_REDIS_URL": "notaurl"}
    done = cli("status", env=env)
    assert done.returncode == 2 and "LIYAGENT_REDIS_URL='notaurl' is not a Redis URL" in done.stderr
    assert "Traceback" not in done.stderr
    bad_tokens = cli("serve", "--port", "0", env={**os.environ, "LIYAGENT_FRONT_TOKENS": "{"})
    assert bad_tokens.returncode == 2 and "LIYAGENT_FRONT_TOKENS is not JSON" in bad_tokens.stderr
    for url in ("mysql://x", "not a url"):
        done = cli("db", "upgrade", "--url", url)
        assert done.returncode == 2 and "--url" in done.stderr, done.stderr
        assert "Traceback" not in done.stderr


def test_user_text_in_a_sql_error_reaches_no_log_or_audit_row(stack) -> None:
    secret = f"s3cret-{uuid.uuid4().hex}"
    # Every process loads the same tools: the client checks the run's list against them.
    stack.reconfigure(tool_modules=("liyagent.vendor_tools", "tests.support.sql_tools"))
    stack.worker("w1")
    run_id = stack.start(
        [step(call("toolu_l", "ledger.lookup", account=secret)), final("x")], user_input="hi"
    )
    # The read raised before any request of it left: a definite failure the model is told
    # (its message, the user's own text, goes only to the model), logged once without it.
    assert stack.wait(run_id).status == "succeeded"
    everything = json.dumps([r.detail for r in stack.rows("SELECT detail FROM audit_events")])
    assert secret not in everything
    log = (stack.tmp / "w1.log").read_text()
    [line] = [json.loads(x) for x in log.splitlines() if '"call.failed"' in x]
    assert (line["run_id"], line["tool"], line["sqlstate"]) == (run_id, "ledger.lookup", "22P02")
    assert line["error"] == "DataError" and line["frames"], line
    assert secret not in log
    with stack.db() as conn:
        assert conn.execute(sa.text("SELECT 1")).scalar_one() == 1
