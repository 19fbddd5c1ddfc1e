"""Operator-facing pieces that need no services: every engine hides SQL parameters, ids are
never wrapped in tables, the trials say when nothing was caught in flight and time a leading
victim's trials apart from the others', job parameters are checked per kind, bad URLs are clear
errors, the front's token configuration, and the facts an error leaves in logs."""

from __future__ import annotations

import ast
import hashlib
import io
import json
import uuid
from datetime import UTC, datetime
from pathlib import Path

import pytest
import sqlalchemy as sa
from rich.console import Console

from front.auth import SHARED_PRINCIPAL, Right, load_tokens, token_digest
from liyagent.cli.main import main
from liyagent.jobs import KINDS as JOB_KINDS
from liyagent.local.verdict import Recovery, Verdict, summary_line, write_report
from liyagent.reporting import render_recent, render_view
from runtime.base.redact import error_facts
from runtime.base.settings import ConfigError, Settings, Timings, database_url, redis_url
from runtime.entries.client import RunView
from runtime.recovery.outage import database_problem
from runtime.toolbox.job_kinds import JobError
from store import db
from store.views import RunSummary

ROOT = Path(__file__).resolve().parents[3]
SKIP = {".venv", ".git", "node_modules"}


def _engine_calls() -> list[tuple[str, ast.Call]]:
    found = []
    for path in ROOT.rglob("*.py"):
        if SKIP & set(path.relative_to(ROOT).parts):
            continue
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Call):
                name = getattr(node.func, "attr", None) or getattr(node.func, "id", None)
                if name == "create_engine":
                    found.append((f"{path.relative_to(ROOT)}:{node.lineno}", node))
    return found


def test_every_engine_hides_sql_parameters() -> None:
    """Parameters carry users' text; an engine without hide_parameters puts them in every
    exception message, and from there in logs and audit rows."""
    calls = _engine_calls()
    assert len(calls) >= 10  # simulators, store, local deployments, tests
    for where, call in calls:
        flags = {k.arg: k.value for k in call.keywords}
        value = flags.get("hide_parameters")
        assert isinstance(value, ast.Constant) and value.value is True, where


def _summary(run_id: str) -> RunSummary:
    now = datetime.now(UTC)
    return RunSummary(run_id, "support-bot", "agent", "failed", 3, 2, 7, "x", now, now, now)


@pytest.mark.parametrize("width", [40, 60, 80])
def test_tables_never_wrap_a_run_id(width: int) -> None:
    run_id = str(uuid.uuid4())
    for render in (
        lambda c: render_recent(c, [_summary(run_id)]),
        lambda c: render_view(c, RunView(run_id, "failed", 3, 2, 7, None, "lost", None)),
    ):
        buffer = io.StringIO()
        render(Console(file=buffer, width=width, highlight=False, color_system=None))
        assert run_id in buffer.getvalue(), buffer.getvalue()


def test_trials_with_nothing_in_flight_say_so(tmp_path: Path) -> None:
    empty = Verdict(trials=3, rounds=1)
    line = summary_line(empty)
    assert "None" not in line
    assert "no trial was caught in flight, so no recovery time was measured" in line
    timed = Verdict(trials=3, rounds=1, caught_in_flight=1, recovery_s=[4.25])
    assert "time to end p50 4.25 s" in summary_line(timed)
    assert "None" not in summary_line(timed)
    png = write_report(empty, tmp_path / "trials.json", {})
    assert png.stat().st_size > 0
    assert json.loads((tmp_path / "trials.json").read_text())["recovery_s"]["p50"] is None


def test_trials_report_time_to_resume_by_whether_the_victim_led(tmp_path: Path) -> None:
    at = datetime.now(UTC)
    led = [Recovery(f"l{i}", f"r{i}", at, 2.0 + i, 1.1 + i / 10, leader=True) for i in range(3)]
    other = [Recovery("f", "rf", at, 2.5, 1.2), Recovery("q", "rq", at, 9.0, 8.0, reserved=True)]
    verdict = Verdict(trials=6, rounds=2, caught_in_flight=4, recoveries=[*led, *other])
    verdict.recovery_s, verdict.resume_s = [2.0, 3.0, 4.0, 2.5], [1.1, 1.2, 1.3, 1.2]
    split = verdict.to_json()["by_victim"]
    assert split["leader"]["trials"] == 3 and split["leader"]["time_to_resume_s"]["p50"] == 1.2
    assert split["follower"]["trials"] == 1  # the reserved trial is not a claimed one
    assert split["follower"]["time_to_resume_s"]["max"] == 1.2
    assert "victim leading the death watch (3): time to resume p50 1.2 s" in summary_line(verdict)
    write_report(verdict, tmp_path / "trials.json", {})
    page = (tmp_path / "trials.html").read_text()
    assert "<td>Led the death watch</td><td>3</td><td>1.2 s / 1.3 s / 1.3 s</td>" in page
    assert "<td>Followed it</td><td>1</td><td>1.2 s / 1.2 s / 1.2 s</td>" in page
    saved = json.loads((tmp_path / "trials.json").read_text())["by_victim"]
    assert saved["leader"]["time_to_end_s"]["max"] == 4.0


@pytest.mark.parametrize(
    ("kind", "params", "says"),
    [
        ("source_sync", {}, "source: Field required"),
        ("source_sync", {"source": "ftp://x"}, "dir:<path> or an http(s) URL"),
        ("source_sync", {"source": "dir:/x", "page_size": 0}, "page_size"),
        ("fine_tune", {"model": "m"}, "dataset: Field required"),
        ("classifier_training", {"examples": []}, "examples"),
        ("classifier_training", {"examples": [{"text": "a"}]}, "examples.0.label"),
        ("red_team", {"agent": "a b", "probes": [{"prompt": "p", "forbidden_tool": "t"}]}, "agent"),
        ("source_sync", {"source": "dir:/x", "pagesize": 3}, "pagesize: Extra inputs"),
    ],
)
def test_job_params_are_checked_per_kind(kind: str, params: dict, says: str) -> None:
    with pytest.raises(JobError, match="bad parameters") as caught:
        JOB_KINDS[kind].check(params)
    assert says in str(caught.value)


def test_good_job_params_pass() -> None:
    JOB_KINDS["source_sync"].check(
        {"source": "dir:/tmp", "page_size": 3}, Settings(source_roots=("/tmp",))
    )
    JOB_KINDS["fine_tune"].check({"model": "m", "dataset": "d", "poll_s": 0.5})
    JOB_KINDS["classifier_training"].check({"examples": [{"text": "a", "label": "b"}]})
    JOB_KINDS["red_team"].check(
        {"agent": "support-bot", "probes": [{"prompt": "p", "forbidden_tool": "x"}]}
    )


def test_the_bound_on_a_models_answer_is_checked_at_start(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("LIYAGENT_MODEL_RESPONSE_MAX_BYTES", raising=False)
    assert Settings.from_env().model_response_max_bytes == 4 << 20
    monkeypatch.setenv("LIYAGENT_MODEL_RESPONSE_MAX_BYTES", "1000")
    with pytest.raises(ConfigError, match="LIYAGENT_MODEL_RESPONSE_MAX_BYTES=1000: a model's"):
        Settings.from_env()
    monkeypatch.setenv("LIYAGENT_MODEL_RESPONSE_MAX_BYTES", "lots")
    with pytest.raises(ConfigError, match="LIYAGENT_MODEL_RESPONSE_MAX_BYTES='lots'"):
        Settings.from_env()


def test_urls_are_checked_with_clear_errors() -> None:
    with pytest.raises(ConfigError, match="LIYAGENT_REDIS_URL='notaurl' is not a Redis URL"):
        redis_url("notaurl")
    with pytest.raises(ConfigError, match="'mysql' is not supported"):
        database_url("mysql://x", "--url")
    assert database_url("postgresql://u@h/db").startswith("postgresql+psycopg://u@h/db")
    assert redis_url("rediss://h:6380/1") == "rediss://h:6380/1"


def test_a_multi_host_database_url_keeps_every_host_in_order() -> None:
    """libpq's multi-host form reaches psycopg as its list of hosts and ports, in order, with
    its other parameters; messages show it as it was written, the password hidden."""
    raw = "postgresql://u:pw@db1:5432,db2:5433/app?target_session_attrs=read-write"
    url = database_url(raw)
    engine = sa.create_engine(url, hide_parameters=True)
    _, kwargs = engine.dialect.create_connect_args(engine.url)
    assert (kwargs["host"], kwargs["port"]) == ("db1,db2", "5432,5433")
    assert kwargs["target_session_attrs"] == "read-write" and kwargs["dbname"] == "app"
    assert db.shown(url) == (
        "postgresql+psycopg://u:***@db1:5432,db2:5433/app?target_session_attrs=read-write"
    )
    assert db.hosts(url) == "db1:5432,db2:5433/app"
    assert database_url(url) == url  # read again by a child process: the same
    with pytest.raises(ConfigError, match="is not a database URL"):
        database_url("postgresql://u@db1:x,db2:5432/app")


def test_only_read_only_hosts_are_said_so() -> None:
    line = 'connection failed: connection to server at "h", port {} failed: {}'
    standby = "\n".join(line.format(p, "session is read-only") for p in (1, 2))
    one_down = "\n".join([line.format(1, "session is read-only"), line.format(2, "refused")])
    url = database_url("postgresql://u@h:1,h:2/app?target_session_attrs=read-write")
    assert "every host it names is read-only" in database_problem(Exception(standby), url)
    assert "promote a standby" in database_problem(Exception(standby), url)
    assert "start it, or point" in database_problem(Exception(one_down), url)


def test_gate_freshness_is_read_from_the_environment_and_checked(monkeypatch) -> None:
    monkeypatch.setenv("LIYAGENT_GATES_FRESH_MS", "0")
    assert Timings.from_env().gates_fresh_ms == 0  # every boundary reads the gates
    monkeypatch.setenv("LIYAGENT_GATES_FRESH_MS", "-1")
    with pytest.raises(ConfigError, match="LIYAGENT_GATES_FRESH_MS must be 0 or more"):
        Timings.from_env()


def test_the_store_grace_defaults_above_a_heartbeat_and_must_exceed_one(monkeypatch) -> None:
    t = Timings(lease_ttl_ms=3000, heartbeat_ms=900, death_grace_ms=1000)
    assert t.store_grace_ms == 1900  # a heartbeat plus the death grace
    monkeypatch.setenv("LIYAGENT_HEARTBEAT_MS", "900")
    monkeypatch.setenv("LIYAGENT_STORE_GRACE_MS", "900")
    with pytest.raises(ConfigError, match="LIYAGENT_STORE_GRACE_MS must exceed"):
        Timings.from_env()


def _settings(**changes: str) -> Settings:
    return Settings(**changes)  # type: ignore[arg-type]


def test_front_tokens_map_to_principals() -> None:
    entries = [
        {"principal": "alice", "sha256": token_digest("a-secret"), "rights": ["decide"]},
        {"principal": "ci", "sha256": token_digest("c-secret"), "rights": ["start"]},
    ]
    tokens = load_tokens(
        _settings(front_tokens=json.dumps({"tokens": entries}), front_token="shared")
    )
    alice, ci, shared = (tokens.find(t) for t in ("a-secret", "c-secret", "shared"))
    assert alice is not None and (alice.name, alice.rights) == ("alice", {Right.DECIDE})
    assert ci is not None and ci.rights == {Right.START}
    assert shared is not None and shared.name == SHARED_PRINCIPAL and shared.rights == set(Right)
    assert tokens.find("a-secre") is None and tokens.find("") is None
    assert token_digest("x") == hashlib.sha256(b"x").hexdigest()


@pytest.mark.parametrize(
    ("argv", "rights"),
    [
        ([], ["start", "decide", "stop", "read"]),  # erase and operate only when named
        (["--rights", "read"], ["read"]),  # a viewer's token: follows streams, starts nothing
        (["--rights", "read,operate"], ["read", "operate"]),  # an operator's: every run
    ],
)
def test_a_new_token_has_the_rights_asked(
    argv: list[str], rights: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["keys", "token", "viewer", *argv]) == 0
    token, entry = capsys.readouterr().out.strip().splitlines()
    loaded = load_tokens(_settings(front_tokens=json.dumps({"tokens": [json.loads(entry)]})))
    found = loaded.find(token)
    assert found is not None and found.rights == {Right(r) for r in rights}


@pytest.mark.parametrize(
    ("config", "says"),
    [
        ("{", "is not JSON"),
        ('{"tokens": {}}', '{"tokens": [...]}'),
        ('[{"principal": "a", "token": "plain", "rights": []}]', "each token is"),
        ('[{"principal": "a", "sha256": "abc", "rights": []}]', "64 lowercase hex"),
        (json.dumps([{"principal": "a", "sha256": "0" * 64, "rights": ["root"]}]), "root"),
        (json.dumps([{"principal": "", "sha256": "0" * 64, "rights": []}]), "one line"),
        (
            json.dumps([{"principal": n, "sha256": "0" * 64, "rights": []} for n in "ab"]),
            "configured twice",
        ),
    ],
)
def test_bad_token_configurations_are_refused(config: str, says: str) -> None:
    with pytest.raises(ConfigError, match=r"LIYAGENT_FRONT_TOKENS|twice") as caught:
        load_tokens(_settings(front_tokens=config))
    assert says in str(caught.value)


def test_a_missing_tokens_file_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"LIYAGENT_FRONT_TOKENS_FILE=.*cannot read"):
        load_tokens(_settings(front_tokens_file=str(tmp_path / "none.json")))


def test_error_facts_carry_no_message() -> None:
    try:
        raise ValueError("secret user text")
    except ValueError as exc:
        facts = error_facts(exc)
    assert facts["error"] == "ValueError" and "test_ops_units.py" in facts["where"]
    assert "secret user text" not in json.dumps(facts)


def test_audit_rows_lost_to_an_outage_are_said_once_with_their_counts() -> None:
    from structlog.testing import capture_logs

    from runtime.recovery import outage

    outage.say_audit_gap()  # nothing left over from another test
    for kind in ("agent.run.error", "agent.run.error", "agent.run.failed"):
        outage.audit_unwritten(kind)
    with capture_logs() as logs:
        said = outage.say_audit_gap()
        again = outage.say_audit_gap()
    assert said == {"agent.run.error": 2, "agent.run.failed": 1} and again == {}
    gaps = [e for e in logs if e["event"] == "audit.gap"]
    assert len(gaps) == 1 and gaps[0]["total"] == 3
