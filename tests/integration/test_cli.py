"""The real `liyagent` command against a per-test deployment: exit codes, JSON, inspect."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
import sqlalchemy as sa

from runtime.local.procs import ROOT
from runtime.sealing import parse_keys
from tests.support.scripts import mixed


def cli(*args: str, env: dict[str, str] | None = None, timeout: float = 120):
    return subprocess.run(
        [sys.executable, "-m", "runtime.cli", *args],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def script_file(tmp_path: Path, tag: str = "c") -> Path:
    path = tmp_path / f"script-{tag}.json"
    path.write_text(json.dumps({"steps": mixed(tag)}))
    return path


def start(stack, path: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return cli(
        "run", "--agent", "support-bot", "--script", str(path), "--input", "help",
        "--json", *extra, env=stack.env,
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
        engine = sa.create_engine(url)
        with engine.connect() as conn:
            tables = set(sa.inspect(conn).get_table_names())
        engine.dispose()
        assert {"runs", "checkpoints", "call_marks", "audit_events", "alembic_version"} <= tables
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
    assert [(r["step"], r["count"]) for r in report["model_requests"]] == [
        (1, 1), (2, 1), (3, 1), (4, 1),
    ]  # fmt: skip
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
        [sys.executable, "-m", "runtime.cli", "run", "--agent", "support-bot", "--script",
         str(script_file(tmp_path, "k")), "--input", "help", "--wait", "--json"],
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
            sa.text("SELECT sealed FROM checkpoints WHERE run_id = :r AND step = 2"), {"r": run_id}
        ).scalar_one()
        tampered = blob[:-1] + bytes([blob[-1] ^ 0x01])
        conn.execute(
            sa.text("UPDATE checkpoints SET sealed = :s WHERE run_id = :r AND step = 2"),
            {"s": tampered, "r": run_id},
        )
    inspected = cli("inspect", run_id, "--json", env=stack.env)
    assert inspected.returncode == 0, inspected.stderr
    by_step = {c["step"]: c for c in json.loads(inspected.stdout)["checkpoints"]}
    assert not by_step[2]["verified"] and "does not verify" in by_step[2]["error"]
    assert by_step[2]["calls"] == []
    assert all(by_step[s]["verified"] for s in (0, 1, 3))
    human = cli("inspect", run_id, env={**stack.env, "COLUMNS": "200"})
    assert human.returncode == 0 and "DOES NOT VERIFY" in human.stdout


def test_unknown_and_malformed_run_ids(stack) -> None:
    unknown = str(uuid.uuid4())
    for command in ("status", "inspect"):
        done = cli(command, unknown, env=stack.env)
        assert done.returncode == 1 and f"run {unknown} does not exist" in done.stderr
        bad = cli(command, "not-a-run", env=stack.env)
        assert bad.returncode == 2 and "is not a run id" in bad.stderr


def test_unreachable_redis_exits_3(stack, tmp_path: Path) -> None:
    env = {**stack.env, "LIYAGENT_REDIS_URL": "redis://127.0.0.1:1/0"}
    done = cli(
        "run", "--agent", "a", "--script", str(script_file(tmp_path)), "--input", "hi", env=env
    )
    assert done.returncode == 3 and "cannot reach Redis" in done.stderr
    assert run_count(stack) == 0
