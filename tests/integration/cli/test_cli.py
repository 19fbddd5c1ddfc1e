"""The real `liyagent` command against a per-test deployment: exit codes, JSON, inspect,
approvals, stops, ad hoc calls, workflows, jobs and the app front."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import uuid
from pathlib import Path

import httpx
import pytest
import sqlalchemy as sa

from liyagent.local.procs import ROOT, Proc, python
from runtime.base.sealing import parse_keys
from tests.support.scripts import call, final, mixed, step
from tests.support.stack import script_tools


def cli(*args: str, env: dict[str, str] | None = None, timeout: float = 120):
    return subprocess.run(
        [sys.executable, "-m", "liyagent.cli.main", *args],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


# The tools `mixed` calls: a run is offered only the tools it names.
MIXED_TOOLS = "ticket.read,incident.create,issue.comment,chat.reply"


def script_file(tmp_path: Path, tag: str = "c") -> Path:
    path = tmp_path / f"script-{tag}.json"
    path.write_text(json.dumps({"steps": mixed(tag)}))
    return path


def start(stack, path: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return cli(
        "run", "--agent", "support-bot", "--script", str(path), "--input", "help",
        "--json", "--tools", MIXED_TOOLS, *extra, env=stack.env,
    )  # fmt: skip


def run_count(stack) -> int:
    return stack.rows("SELECT count(*) AS n FROM runs")[0].n


def test_keys_new_prints_one_entry() -> None:
    default = cli("keys", "new")
    assert default.returncode == 0, default.stderr
    lines = default.stdout.splitlines()
    assert len(lines) == 1 and re.fullmatch(r"k\d{8}:[A-Za-z0-9+/=]{44}", lines[0])
    named = cli("keys", "new", "prod2")
    sealer = parse_keys(named.stdout.strip())
    assert sealer.current == "prod2" and len(sealer.keys["prod2"]) == 32
    bad = cli("keys", "new", "a:b")
    assert bad.returncode == 2 and "key id" in bad.stderr


def test_db_upgrade_migrates_a_fresh_database(admin_engine, servers) -> None:
    name = f"lyt_cli_{uuid.uuid4().hex[:12]}"
    with admin_engine.connect() as conn:
        conn.execute(sa.text(f"CREATE DATABASE {name}"))
    url = sa.make_url(servers[0]).set(database=name).render_as_string(hide_password=False)
    try:
        done = cli("db", "upgrade", "--url", url)
        assert done.returncode == 0, done.stderr
        engine = sa.create_engine(url, hide_parameters=True)
        with engine.connect() as conn:
            tables = set(sa.inspect(conn).get_table_names())
        engine.dispose()
        assert {"runs", "call_marks", "audit_events", "alembic_version"} <= tables
        again = cli("db", "upgrade", "--url", url)  # idempotent
        assert again.returncode == 0, again.stderr
    finally:
        with admin_engine.connect() as conn:
            conn.execute(sa.text(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)"))


def test_unreachable_postgres_exits_3() -> None:
    dead = "postgresql+psycopg://postgres@127.0.0.1:1/nothing"
    done = cli("db", "upgrade", "--url", dead)
    assert done.returncode == 3 and "cannot use Postgres at" in done.stderr


def test_run_wait_status_and_inspect(stack, tmp_path: Path) -> None:
    stack.worker("w1")
    done = start(stack, script_file(tmp_path), "--wait", "--timeout", "60")
    assert done.returncode == 0, done.stderr
    view = json.loads(done.stdout)
    assert view["status"] == "succeeded" and view["answer"] == "Handled c."
    run_id = view["run_id"]

    status = cli("status", run_id, "--json", env=stack.env)
    assert status.returncode == 0, status.stderr
    assert json.loads(status.stdout)["status"] == "succeeded"
    recent = cli("status", "--json", "--limit", "5", env=stack.env)
    assert [r["id"] for r in json.loads(recent.stdout)] == [run_id]

    report = json.loads(cli("inspect", run_id, "--json", env=stack.env).stdout)
    assert report["run"]["attempts"] == 1 and report["run"]["lost_count"] == 0
    checkpoints = report["checkpoints"]
    assert [c["step"] for c in checkpoints] == [0, 1, 2, 3]
    assert all(c["verified"] and c["attempt"] == 1 for c in checkpoints)
    assert [c["tool"] for c in checkpoints[1]["calls"]] == ["ticket.read", "incident.create"]
    assert [(m["tool"], m["kind"], m["status"]) for m in report["marks"]] == [
        ("incident.create", "keyed_write", "done"),
        ("issue.comment", "write", "done"),
        ("chat.reply", "write", "done"),
    ]
    assert report["transcript"][-1] == {"role": "assistant", "content": "Handled c."}
    human = cli("inspect", run_id, env=stack.env)
    assert human.returncode == 0 and "Checkpoints" in human.stdout and "verified" in human.stdout


def test_run_without_wait_prints_the_id(stack, tmp_path: Path) -> None:
    done = cli(
        "run", "--agent", "a", "--script", str(script_file(tmp_path)), "--input", "hi",
        "--request-key", "rk-1", env=stack.env,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    run_id = done.stdout.strip()
    assert str(uuid.UUID(run_id)) == run_id
    again = cli(
        "run", "--agent", "a", "--script", str(script_file(tmp_path)), "--input", "hi",
        "--request-key", "rk-1", env=stack.env,
    )  # fmt: skip
    assert again.stdout.strip() == run_id  # the request key makes it idempotent
    assert run_count(stack) == 1


def test_resumed_run_shows_its_loss_in_inspect(stack, tmp_path: Path) -> None:
    stack.worker("victim", fault="after_checkpoint:kill")
    waiting = subprocess.Popen(
        [sys.executable, "-m", "liyagent.cli.main", "run", "--agent", "support-bot", "--script",
         str(script_file(tmp_path, "k")), "--input", "help", "--tools", MIXED_TOOLS, "--wait",
         "--json"],
        env=stack.env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    stack.fault_hit("victim")
    stack.worker("survivor")
    stack.beat()
    out, err = waiting.communicate(timeout=90)
    assert waiting.returncode == 0, err
    run_id = json.loads(out)["run_id"]
    report = json.loads(cli("inspect", run_id, "--json", env=stack.env).stdout)
    assert report["run"]["attempts"] == 2 and report["run"]["lost_count"] == 1
    kinds = [a["kind"] for a in report["audit"]]
    assert kinds == ["agent.run.lost", "agent.run.crash_resumed"]
    resumed = report["audit"][1]
    assert [c["settled"] for c in resumed["detail"]["calls"]] == ["made", "made"]
    assert [c["attempt"] for c in report["checkpoints"]] == [1, 1, 2, 2]
    assert {m["attempt"] for m in report["marks"]} == {2}
    _check_inspect_shows_times_and_calls(stack, run_id, report)


STAMP = r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3} UTC"


def _check_inspect_shows_times_and_calls(stack, run_id: str, report: dict) -> None:
    """`inspect`, piped: each audit row with its time, each tool call in the transcript with
    its tool, kind, arguments, settlement and result, every row on one line with whole ids."""
    assert all(re.fullmatch(r"\d{4}-.*[+-]\d\d:\d\d", a["created_at"]) for a in report["audit"])
    calls = [(c["step"], c["tool"], c["kind"], c["settled"]) for c in report["tool_calls"]]
    assert calls == [
        (1, "ticket.read", "read", "made"),
        (1, "incident.create", "keyed_write", "made"),
        (2, "issue.comment", "write", "made"),
        (3, "chat.reply", "write", "made"),
    ]
    first = report["tool_calls"][0]
    assert first["call_id"] == "toolu_k_r" and '"ticket": "T-k"' in first["args"]
    assert "T-k" in first["result"]  # the read's result, as the model was told it
    assert report["tool_calls"][3]["result"] != "-"  # the last step's write: its outcome
    env = {k: v for k, v in stack.env.items() if k != "COLUMNS"}  # piped, no width asked for
    human = cli("inspect", run_id, env=env)
    assert human.returncode == 0, human.stderr
    lines = human.stdout.splitlines()
    lost = next(a for a in report["audit"] if a["kind"] == "agent.run.lost")
    (row,) = [ln for ln in lines if "agent.run.lost" in ln]
    assert re.search(STAMP + r" +│ agent\.run\.lost", row), row
    assert f'"lost_holder": "{lost["detail"]["lost_holder"]}"' in row  # whole, on one line
    (row,) = [ln for ln in lines if "agent.run.crash_resumed" in ln]
    assert re.search(STAMP, row), row
    (read,) = [ln for ln in lines if "ticket.read (read)" in ln]
    assert "tool call" in read and "step 1 toolu_k_r" in read and '"ticket": "T-k"' in read
    assert any("-> made:" in ln and "T-k" in ln for ln in lines)
    assert any(f"Run {run_id} (agent support-bot)" in ln for ln in lines)
    recent = cli("status", env=env)
    (row,) = [ln for ln in recent.stdout.splitlines() if run_id in ln]
    assert "support-bot" in row and "succeeded" in row and re.search(r"\d\d:\d\d:\d\d", row)


def test_inspect_shows_a_call_with_its_secrets_redacted(stack, tmp_path: Path) -> None:
    secret = "sk-live-0123456789abcdef"
    path = tmp_path / "script-s.json"
    steps = [step(call("toolu_s_r", "ticket.read", ticket="T-s", api_key=secret)), final("ok")]
    path.write_text(json.dumps({"steps": steps}))
    stack.worker("w1")
    done = start(stack, path, "--wait", "--timeout", "60")
    assert done.returncode == 0, done.stderr
    run_id = json.loads(done.stdout)["run_id"]
    shown = cli("inspect", run_id, "--json", env=stack.env)
    (entry,) = json.loads(shown.stdout)["tool_calls"]
    assert (entry["tool"], entry["kind"], entry["step"]) == ("ticket.read", "read", 1)
    assert '"api_key": "[redacted]"' in entry["args"] and '"ticket": "T-s"' in entry["args"]
    # Piped, no width asked for (pytest-xdist's workers export COLUMNS=80).
    human = cli("inspect", run_id, env={k: v for k, v in stack.env.items() if k != "COLUMNS"})
    assert human.returncode == 0 and "ticket.read (read)" in human.stdout
    assert secret not in shown.stdout + human.stdout + human.stderr


def test_failed_run_exits_1_with_its_reason(stack, tmp_path: Path) -> None:
    stack.worker("w1", env={"LIYAGENT_STEP_LIMIT": "1"})
    done = start(stack, script_file(tmp_path), "--wait", "--timeout", "60")
    assert done.returncode == 1, done.stderr
    view = json.loads(done.stdout)
    assert view["status"] == "failed" and "step limit 1" in view["failure_reason"]
    report = json.loads(cli("inspect", view["run_id"], "--json", env=stack.env).stdout)
    assert [a["kind"] for a in report["audit"]] == ["agent.run.failed"]


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ('{"steps": []}', "at least one step"),
        ('{"steps": [{"calls": [], "final": "x"}]}', "exactly one of"),
        ("not json", "is not JSON"),
    ],
)
def test_bad_script_exits_2_and_stores_nothing(stack, tmp_path, content, message) -> None:
    path = tmp_path / "bad.json"
    path.write_text(content)
    done = start(stack, path, "--wait")
    assert done.returncode == 2 and message in done.stderr, done.stderr
    assert done.stdout == ""
    assert run_count(stack) == 0


def test_bad_usage_exits_2(stack, tmp_path: Path) -> None:
    missing = start(stack, tmp_path / "missing.json")
    assert missing.returncode == 2 and "cannot read the script file" in missing.stderr
    tools = start(stack, script_file(tmp_path), "--tools", "ticket.read,rm.rf")
    assert tools.returncode == 2 and "rm.rf" in tools.stderr
    assert cli("status", "--frobnicate", env=stack.env).returncode == 2
    assert run_count(stack) == 0


def test_tampered_checkpoint_is_shown_as_not_verifying(stack, tmp_path: Path) -> None:
    stack.worker("w1")
    done = start(stack, script_file(tmp_path), "--wait", "--timeout", "60")
    run_id = json.loads(done.stdout)["run_id"]
    with stack.db() as conn:
        blob = conn.execute(
            sa.text("SELECT checkpoint FROM runs WHERE id = :r"), {"r": run_id}
        ).scalar_one()
        tampered = blob[:-1] + bytes([blob[-1] ^ 0x01])
        conn.execute(
            sa.text("UPDATE runs SET checkpoint = :s WHERE id = :r"), {"s": tampered, "r": run_id}
        )
    inspected = cli("inspect", run_id, "--json", env=stack.env)
    assert inspected.returncode == 0, inspected.stderr
    [shown] = json.loads(inspected.stdout)["checkpoints"]
    assert shown["step"] == 3 and not shown["verified"] and "does not verify" in shown["error"]
    assert shown["calls"] == []
    human = cli("inspect", run_id, env={**stack.env, "COLUMNS": "200"})
    assert human.returncode == 0 and "DOES NOT VERIFY" in human.stdout


def test_unknown_and_malformed_run_ids(stack) -> None:
    unknown = str(uuid.uuid4())
    for command in ("status", "inspect"):
        done = cli(command, unknown, env=stack.env)
        assert done.returncode == 1 and f"run {unknown} does not exist" in done.stderr
        bad = cli(command, "not-a-run", env=stack.env)
        assert bad.returncode == 2 and "is not a valid run id" in bad.stderr


def test_unreachable_redis_exits_3(stack, tmp_path: Path) -> None:
    env = {**stack.env, "LIYAGENT_REDIS_URL": "redis://127.0.0.1:1/0"}
    done = cli(
        "run", "--agent", "a", "--script", str(script_file(tmp_path)), "--input", "hi", env=env
    )
    assert done.returncode == 3 and "cannot reach Redis" in done.stderr
    assert run_count(stack) == 0


PAGE = [
    step(call("toolu_p1", "incident.page", title="Checkout down", severity="sev1")),
    final("Paged."),
]


def out_json(done: subprocess.CompletedProcess[str]):
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def start_steps(stack, tmp_path: Path, steps, *extra: str) -> str:
    """Start a run through `liyagent run` with these scripted steps; returns its id."""
    path = tmp_path / f"steps-{uuid.uuid4().hex[:6]}.json"
    path.write_text(json.dumps({"steps": steps}))
    tools = ["--tools", ",".join(script_tools(steps))] if script_tools(steps) else []
    done = cli(
        "run", "--agent", "pager", "--script", str(path), "--input", "page", *tools, *extra,
        env=stack.env,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def held_approval(stack, tmp_path: Path) -> tuple[str, dict]:
    """A run waiting on its incident.page approval, listed by `liyagent approvals`."""
    stack.worker("w1")
    run_id = stack.start(PAGE)
    stack.client.wait(run_id, timeout_s=60, until=frozenset({"waiting"}))
    [listed] = out_json(cli("approvals", run_id, "--json", env=stack.env))
    assert (listed["tool"], listed["status"], listed["decided_by"]) == (
        "incident.page", "pending", None,
    )  # fmt: skip
    human = cli("approvals", run_id, env={**stack.env, "COLUMNS": "200"})
    assert human.returncode == 0 and listed["id"] in human.stdout and "pending" in human.stdout
    return run_id, listed


def incident_posts(stack, run_id: str):
    return stack.vendor(
        "SELECT idem_key FROM sim.requests WHERE run_id = :r AND vendor = 'incidents' "
        "AND method = 'POST'",
        r=run_id,
    )


def test_approve_lets_the_held_call_be_made_once(stack, tmp_path: Path) -> None:
    run_id, listed = held_approval(stack, tmp_path)
    decided = out_json(cli("approve", listed["id"], "--by", "alice", "--json", env=stack.env))
    assert (decided["status"], decided["decided_by"], decided["run_id"]) == (
        "approved", "alice", run_id,
    )  # fmt: skip
    assert stack.wait(run_id).status == "succeeded"
    assert [p.idem_key for p in incident_posts(stack, run_id)] == [listed["id"]]
    for again in ("approve", "deny"):
        done = cli(again, listed["id"], "--by", "bob", env=stack.env)
        assert done.returncode == 1 and "already approved by alice" in done.stderr
        assert run_id in done.stderr
    [after] = out_json(cli("approvals", run_id, "--json", env=stack.env))
    assert (after["status"], after["decided_by"]) == ("approved", "alice")


def test_deny_is_told_to_the_model_and_nothing_is_sent(stack, tmp_path: Path) -> None:
    run_id, listed = held_approval(stack, tmp_path)
    denied = cli("deny", listed["id"], "--by", "dave", "--reason", "not an outage", env=stack.env)
    assert denied.returncode == 0 and "denied by dave" in denied.stdout, denied.stderr
    assert stack.wait(run_id).status == "succeeded"
    assert incident_posts(stack, run_id) == []
    assert stack.told(run_id, 2)[0]["reason"] == "not an outage"


def test_approval_commands_refuse_bad_and_unknown_ids(stack) -> None:
    unknown = str(uuid.uuid4())
    missing = cli("approve", unknown, "--by", "x", env=stack.env)
    assert missing.returncode == 1 and f"approval {unknown} does not exist" in missing.stderr
    malformed = cli("deny", "not-an-id", "--by", "x", env=stack.env)
    assert malformed.returncode == 2 and "is not an approval id" in malformed.stderr
    assert cli("approve", unknown, env=stack.env).returncode == 2  # --by is required
    blank = cli("approve", unknown, "--by", " ", env=stack.env)
    assert blank.returncode == 2 and "--by" in blank.stderr
    no_run = cli("approvals", unknown, env=stack.env)
    assert no_run.returncode == 1 and f"run {unknown} does not exist" in no_run.stderr
    assert cli("approvals", "nope", env=stack.env).returncode == 2
    assert stack.rows("SELECT count(*) AS n FROM approvals")[0].n == 0


def test_stop_fails_queued_runs_now(stack, tmp_path: Path) -> None:
    first, second = (start_steps(stack, tmp_path, PAGE) for _ in range(2))  # no worker: queued
    stopped = out_json(
        cli("stop", "--run", first, "--reason", "bad deploy", "--by", "ops", "--json",
            env=stack.env)
    )  # fmt: skip
    assert stopped["stopped_now"] == [first]
    view = stack.client.get(first)
    assert view.status == "failed" and view.failure_reason == "stopped by ops: bad deploy"
    again = cli("stop", "--run", first, "--reason", "r", "--by", "ops", env=stack.env)
    assert again.returncode == 1 and f"run {first} already failed" in again.stderr
    by_agent = cli("stop", "--agent", "pager", "--reason", "paused", "--by", "ops", env=stack.env)
    assert by_agent.returncode == 0 and second in by_agent.stdout, by_agent.stderr
    assert stack.client.get(second).status == "failed"
    assert stack.rows("SELECT count(*) AS n FROM stops")[0].n == 2


def test_stop_ends_a_running_run_at_once(stack, tmp_path: Path) -> None:
    stack.worker("w1")
    # Long enough that the stop (a CLI process starting up, slow on a loaded machine) comes
    # while the run is running: four 4 s steps; the stop ends it at once.
    slow = [
        *(step(call(f"toolu_{n}", "ticket.read", ticket="T-1"), latency_ms=4000) for n in range(4)),
        final("x"),
    ]
    run_id = start_steps(stack, tmp_path, slow)
    stack.client.wait(run_id, timeout_s=60, until=frozenset({"running"}))
    stopped = out_json(
        cli("stop", "--run", run_id, "--reason", "r", "--by", "ops", "--json", env=stack.env)
    )
    assert stopped["stopped_now"] == [run_id]
    view = stack.client.get(run_id)
    assert (view.status, view.failure_reason) == ("failed", "stopped by ops: r")


def test_stop_refuses_bad_input_and_stores_nothing(stack) -> None:
    unknown = str(uuid.uuid4())
    for args, code in [
        (("--run", unknown, "--agent", "a", "--reason", "r", "--by", "o"), 2),
        (("--agent", "a", "--reason", " ", "--by", "o"), 2),
        (("--agent", "a", "--reason", "r"), 2),
        (("--run", "nope", "--reason", "r", "--by", "o"), 2),
        (("--run", unknown, "--reason", "r", "--by", "o"), 1),
    ]:
        done = cli("stop", *args, env=stack.env)
        assert done.returncode == code, (args, done.stderr)
    assert stack.rows("SELECT count(*) AS n FROM stops")[0].n == 0


def test_call_gets_a_fresh_key_each_time(stack) -> None:
    made = [
        out_json(
            cli("call", "incident.create", "--args", '{"title": "manual"}', "--by", "alice",
                "--json", env=stack.env)
        )
        for _ in range(2)
    ]  # fmt: skip
    assert [m["status"] for m in made] == ["made", "made"]
    keys = [m["key"] for m in made]
    assert keys[0] != keys[1]
    incidents = stack.vendor("SELECT idem_key FROM sim.incidents WHERE idem_key IN (:a, :b)",
                             a=keys[0], b=keys[1])  # fmt: skip
    assert sorted(i.idem_key for i in incidents) == sorted(keys)
    human = cli("call", "ticket.read", "--args", '{"ticket": "T-9"}', "--by", "bob", env=stack.env)
    assert human.returncode == 0 and "status: made" in human.stdout, human.stderr
    audit = stack.rows("SELECT detail FROM audit_events WHERE kind = 'tool.adhoc_call'")
    assert [a.detail["by"] for a in audit] == ["alice", "alice", "bob"]


def test_call_refuses_bad_input_and_sends_nothing(stack) -> None:
    unknown = cli("call", "rm.rf", "--by", "x", env=stack.env)
    assert unknown.returncode == 2 and "incident.create" in unknown.stderr  # lists known tools
    for bad in ("{not json", "[1, 2]"):
        done = cli("call", "incident.create", "--args", bad, "--by", "x", env=stack.env)
        assert done.returncode == 2 and "--args" in done.stderr
    held = cli("call", "incident.page", "--args", "{}", "--by", "x", env=stack.env)
    assert held.returncode == 2 and "only be made by a run" in held.stderr
    assert stack.rows("SELECT count(*) AS n FROM audit_events")[0].n == 0


WORKFLOW = {
    "start": "open",
    "steps": {
        "open": {"tool": "incident.create", "args": {"title": "Disk full"}, "next": "check"},
        "check": {"tool": "ticket.read", "args": {"ticket": "T-1"}, "next": None},
    },
}


def test_workflow_and_job_commands(stack, tmp_path: Path) -> None:
    stack.worker("w1")
    path = tmp_path / "wf.json"
    path.write_text(json.dumps(WORKFLOW))
    done = out_json(cli("workflow", "--name", "disk", "--file", str(path), "--wait", "--json",
                        env=stack.env))  # fmt: skip
    assert done["status"] == "succeeded" and json.loads(done["answer"])["executed"] == 2
    examples = [
        {"text": "card declined", "label": "billing"},
        {"text": "500 error", "label": "bug"},
    ]
    job = out_json(
        cli("job", "classifier_training", "--params", json.dumps({"examples": examples}),
            "--wait", "--json", env=stack.env)
    )  # fmt: skip
    assert job["status"] == "succeeded"
    assert json.loads(job["answer"])["labels"] == {"billing": 1, "bug": 1}
    kinds = stack.rows("SELECT kind, agent FROM runs ORDER BY created_at")
    assert [(k.kind, k.agent) for k in kinds] == [
        ("workflow", "disk"), ("job", "job:classifier_training"),
    ]  # fmt: skip


def test_workflow_and_job_refuse_bad_input(stack, tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"start": "a", "steps": {"a": {"tool": "x", "next": "nowhere"}}}))
    broken = tmp_path / "broken.json"
    broken.write_text("{")
    for args, message in [
        (("workflow", "--name", "w", "--file", str(bad)), "names no step"),
        (("workflow", "--name", "w", "--file", str(broken)), "is not JSON"),
        (("workflow", "--name", "w", "--file", str(tmp_path / "none.json")), "cannot read"),
        (("job", "mine_bitcoin", "--params", "{}"), "unknown job kind"),
        (("job", "source_sync", "--params", "{oops"), "--params is not JSON"),
        (("job", "source_sync", "--params", "[]"), "must be a JSON object"),
    ]:
        done = cli(*args, env=stack.env)
        assert done.returncode == 2 and message in done.stderr, (args, done.stderr)
    assert run_count(stack) == 0


def test_serve_answers_healthz_and_metrics(stack, tmp_path: Path) -> None:
    server = Proc("serve", python("-m", "liyagent.cli.main", "serve", "--port", "0"), stack.env,
                  tmp_path / "serve.log")  # fmt: skip
    try:
        url = server.wait_for(r"front listening on (http://\S+)", timeout=30).group(1)
        with httpx.Client(base_url=url, timeout=10) as http:
            assert http.get("/healthz").json() == {"ok": True}
            scraped = http.get("/metrics")
            assert (
                scraped.status_code == 200 and 'liyagent_runs{status="queued"} 0.0' in scraped.text
            )
        assert server.alive()
    finally:
        server.kill()
    assert cli("serve", "--port", "70000", env=stack.env).returncode == 2
