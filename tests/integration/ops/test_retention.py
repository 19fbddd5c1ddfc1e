"""Retention: finished runs past their keep are deleted by bounded batches, oldest first, with
every row that names them; what a guarantee still needs is kept (a run not finished, an answer
not handed on or still within its own retention, a request key still deduping, a child whose
parent runs); two passes at once take disjoint batches; beat drives it."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
import uuid

import sqlalchemy as sa
from prometheus_client import generate_latest
from prometheus_client.registry import CollectorRegistry

from bench.bulk import finish_runs, insert_running_runs
from liyagent.local.procs import ROOT
from runtime.base.settings import Retention
from runtime.ops.metrics import LiyagentCollector
from runtime.ops.retention import RetentionReport, keeps_of, run_retention
from store.entries import purge_answers
from store.records import insert_audit
from store.retention import WITH_RUN, delete_expired_runs
from store.runs import claim_delivery, store_answer
from store.schema import metadata
from tests.support.scripts import call, final, step
from tests.support.stored_runs import stored_run

DAY = 86400
# Tables naming a run: every row of a deleted run must be gone from each.
RUN_TABLES = sorted(t.name for t in metadata.tables.values() if "run_id" in t.c)


def cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """`liyagent ARGS` as an operator runs it."""
    argv = [sys.executable, "-m", "liyagent.cli.main", *args]
    return subprocess.run(argv, env=env, cwd=ROOT, capture_output=True, text=True, timeout=120)


def _age(stack, run_id: str, days: float) -> None:
    """Move a run's times (and its audit rows') `days` into the past: what waiting would do."""
    with stack.db() as conn:
        conn.exec_driver_sql(
            "UPDATE runs SET finished_at = finished_at - make_interval(secs => %(s)s), "
            "answer_expires_at = answer_expires_at - make_interval(secs => %(s)s) "
            "WHERE id = %(r)s",
            {"s": days * DAY, "r": run_id},
        )
        conn.exec_driver_sql(
            "UPDATE audit_events SET created_at = created_at - make_interval(secs => %(s)s) "
            "WHERE run_id = %(r)s",
            {"s": days * DAY, "r": run_id},
        )


def _finished_run(stack, tag: str, **options) -> str:
    """A real run through a worker: a write call (a call mark), then the answer."""
    run_id = stack.client.start_run(
        agent="support-bot",
        model=stack.model([step(call(f"toolu_{tag}", "incident.create", title=tag)), final()]),
        user_input=f"input {tag}",
        tools=["incident.create"],
        **options,
    )
    assert stack.wait(run_id).status == "succeeded"
    with stack.db() as conn:  # a happy run writes no audit row; an operator's look does
        insert_audit(conn, kind="test.looked_at", run_id=run_id, detail={"by": "ops"})
    return run_id


def _queued_run(stack) -> str:
    """A run that is not finished (queued, never published)."""
    return stored_run(stack, "kept")


def _left(stack, run_id: str) -> dict[str, int]:
    """Rows naming the run, table by table (the run's own row under `runs`)."""
    counts = {"runs": stack.rows("SELECT count(*) AS n FROM runs WHERE id = :r", r=run_id)[0].n}
    for table in RUN_TABLES:
        n = stack.rows(f"SELECT count(*) AS n FROM {table} WHERE run_id = :r", r=run_id)[0].n
        counts[table] = n
    return counts


def test_retention_deletes_expired_runs_in_batches_and_keeps_what_guarantees_need(stack) -> None:
    stack.worker("w1")
    plain = [_finished_run(stack, f"p{i}") for i in range(5)]
    teams, a2a, cron = (_finished_run(stack, tag) for tag in ("teams", "a2a", "cron"))
    keyed_closed = _finished_run(stack, "kc", request_key=f"rk-{uuid.uuid4()}")
    keyed_open = _finished_run(stack, "ko", request_key=f"rk-{uuid.uuid4()}")
    held_answer, child, recent = (_finished_run(stack, t) for t in ("held", "child", "recent"))
    parent, queued = _queued_run(stack), _queued_run(stack)
    # An answered run: its answer is stored but not handed on yet.
    answered = _queued_run(stack)
    with stack.db() as conn:
        assert claim_delivery(conn, answered, 1, "test") is not None
        store_answer(conn, answered, 1, stack.sealer.seal(answered, "answer", 0, {"text": "a"}))
        ids = {"t": teams, "a": a2a, "c": cron, "p": parent, "ch": child}
        for statement in (
            "UPDATE runs SET entry_kind = 'teams' WHERE id = %(t)s",
            "UPDATE runs SET entry_kind = 'a2a' WHERE id = %(a)s",
            "UPDATE runs SET entry_kind = 'cron' WHERE id = %(c)s",
            "UPDATE runs SET parent_run_id = %(p)s WHERE id = %(ch)s",
            "INSERT INTO teams_inbox (message_id, conversation, sender_id, agent, text, status, "
            "run_id) VALUES ('m1', 'conv', '0b0a0000-0000-0000-0000-00000000a11e', "
            "'support-bot', 'hi', 'replied', %(t)s)",
            "INSERT INTO a2a_tasks (id, run_id, status) VALUES ('task-1', %(a)s, 'completed')",
            "INSERT INTO cron_runs (trigger, scheduled_at, run_id, status) "
            "VALUES ('nightly', now(), %(c)s, 'succeeded')",
            "INSERT INTO stops (run_id, reason, created_by) VALUES (%(t)s, 'r', 'ops')",
        ):
            conn.exec_driver_sql(statement, ids)
    # Oldest first: the four past the key window (70 days), then the plain ones (40 days).
    for i, run_id in enumerate([teams, a2a, cron, keyed_closed]):
        _age(stack, run_id, 70 - i / 100)
    for i, run_id in enumerate([*plain, keyed_open, child]):
        _age(stack, run_id, 40 - i / 100)
    _age(stack, held_answer, 15)  # past the run's keep, not past its answer's
    r = Retention(keep_s=10 * DAY, key_window_s=60 * DAY, audit_keep_s=20 * DAY, batch=3)
    stack.reconfigure(retention=r, answer_retention_s=20 * DAY)

    with stack.db() as conn:
        first = delete_expired_runs(conn, keeps_of(stack.settings), batch=3)
    assert first.deleted == 3
    assert [_left(stack, x)["runs"] for x in (teams, a2a, cron, keyed_closed)] == [0, 0, 0, 1]

    report = run_retention(stack.services.engine, stack.services.redis, stack.services.settings)
    assert report.runs == 6 and report.per_batch[:3] == [3, 3, 0]
    deleted = [teams, a2a, cron, keyed_closed, *plain]
    for run_id in deleted:
        assert set(_left(stack, run_id).values()) == {0}, (run_id, _left(stack, run_id))
    for run_id in (keyed_open, held_answer, child, recent, parent, queued, answered):
        assert _left(stack, run_id)["runs"] == 1, run_id
    assert _left(stack, child)["call_marks"] == 1 and _left(stack, child)["audit_events"] > 0
    # Audit rows outlive their run only by the audit keep; rows of kept runs stay.
    assert report.audit > 0
    orphans = stack.rows(
        "SELECT count(*) AS n FROM audit_events a WHERE a.run_id IS NOT NULL AND NOT EXISTS "
        "(SELECT 1 FROM runs r WHERE r.id = a.run_id)"
    )
    assert orphans[0].n == 0

    registry = CollectorRegistry()
    registry.register(
        LiyagentCollector(
            stack.services.engine,
            stack.services.redis,
            stack.services.settings.namespace,
            strict=True,
        )
    )
    scraped = generate_latest(registry).decode()
    assert 'liyagent_retention_deleted_total{what="runs"} 6.0' in scraped
    assert "liyagent_retention_batches_total" in scraped


def test_two_passes_at_once_take_disjoint_batches(stack) -> None:
    with stack.db() as conn:
        ids = insert_running_runs(conn, 60, agent="bulk")
        finish_runs(conn, ids)
        conn.exec_driver_sql(
            "UPDATE runs SET finished_at = now() - interval '2 days' WHERE agent = 'bulk'"
        )
    stack.reconfigure(retention=Retention(keep_s=DAY, batch=4, max_batches=100))
    start = threading.Barrier(2)
    reports: list[RetentionReport] = []
    errors: list[BaseException] = []

    def one_pass() -> None:
        start.wait()
        try:
            reports.append(
                run_retention(stack.services.engine, stack.services.redis, stack.services.settings)
            )
        except BaseException as exc:  # reported by the assertion below
            errors.append(exc)

    threads = [threading.Thread(target=one_pass) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert errors == [] and len(reports) == 2
    assert sum(r.runs for r in reports) == 60
    assert stack.rows("SELECT count(*) AS n FROM runs")[0].n == 0


def test_two_beats_run_retention_and_keep_tables_bounded(stack) -> None:
    stack.extra_env.update(
        {
            "LIYAGENT_RETENTION_S": "1",
            "LIYAGENT_RETENTION_KEY_WINDOW_S": "1",
            "LIYAGENT_RETENTION_AUDIT_S": "1",
            "LIYAGENT_RETENTION_INTERVAL_S": "1",
            "LIYAGENT_RETENTION_BATCH": "2",
        }
    )
    stack.reconfigure(answer_retention_s=1)
    worker = stack.worker("w1")
    stack.beat("beat1")
    stack.beat("beat2")
    run_ids = [_finished_run(stack, f"b{i}") for i in range(5)]
    deadline = time.monotonic() + 60
    while any(_left(stack, r)["runs"] for r in run_ids):
        assert time.monotonic() < deadline, "retention did not delete the finished runs"
        time.sleep(0.5)
    worker.wait_for(r"retention\.batch", timeout=10)
    assert "Traceback" not in worker.output()


# Keeps short enough that runs finished a moment ago are past them.
SHORT = {
    "LIYAGENT_RETENTION_S": "1",
    "LIYAGENT_RETENTION_KEY_WINDOW_S": "1",
    "LIYAGENT_RETENTION_AUDIT_S": "1",
    "LIYAGENT_ANSWER_RETENTION_S": "1",
}


def test_a_lowered_keep_applies_to_runs_finished_before_it(stack) -> None:
    # Finished under the defaults: the run kept 30 days, its answer a day (issue 31: the
    # answer's expiry was stamped at finish, so lowering the settings never reached them).
    stack.worker("w1")
    runs = [_finished_run(stack, f"l{i}") for i in range(3)]
    time.sleep(1.5)
    stack.reconfigure(
        retention=Retention(keep_s=1, key_window_s=1, audit_keep_s=1), answer_retention_s=1
    )
    with stack.db() as conn:  # the answer purge applies the answer's keep in force too
        assert purge_answers(conn, stack.settings.answer_retention_s) == 3
    report = run_retention(stack.services.engine, stack.services.redis, stack.services.settings)
    assert report.runs == 3
    for run_id in runs:
        assert set(_left(stack, run_id).values()) == {0}, (run_id, _left(stack, run_id))


def test_retention_run_says_what_would_go_then_deletes_it(stack) -> None:
    worker = stack.worker("w1")
    runs = [_finished_run(stack, f"d{i}") for i in range(3)]
    worker.stop()  # so the run below stays queued: no sweep publishes it again
    kept = _queued_run(stack)
    time.sleep(1.5)
    before = {r: _left(stack, r) for r in [*runs, kept]}
    env = {**stack.env, **SHORT}

    dry = cli("retention", "run", "--dry-run", "--json", env=env)
    assert dry.returncode == 0, dry.stderr
    said = json.loads(dry.stdout)
    assert said["dry_run"] is True and said["keeps"]["answer_keep_s"] == 1
    would = said["would_delete"]
    expected = {t: sum(before[r].get(t, 0) for r in runs) for t in ("runs", *WITH_RUN)}
    assert {t: would[t] for t in expected} == expected
    assert would["runs"] == 3 and would["call_marks"] == 3 and would["transcript_messages"] >= 3
    assert would["audit_events"] >= 3  # the looks at the three runs, at least
    assert {r: _left(stack, r) for r in [*runs, kept]} == before  # nothing deleted
    human = cli("retention", "run", "--dry-run", env=env)
    assert human.returncode == 0 and "Dry run: nothing was deleted" in human.stdout
    assert {r: _left(stack, r) for r in [*runs, kept]} == before

    done = cli("retention", "run", "--json", env=env)
    assert done.returncode == 0, done.stderr
    deleted = json.loads(done.stdout)["deleted"]
    assert deleted == {"runs": 3, "audit_events": would["audit_events"]}
    for run_id in runs:
        assert set(_left(stack, run_id).values()) == {0}, (run_id, _left(stack, run_id))
    assert _left(stack, kept) == before[kept]  # not finished: kept whatever the keeps

    off = cli("retention", "run", env={**env, "LIYAGENT_RETENTION": "false"})
    assert off.returncode == 1 and "nothing was deleted" in off.stderr


def test_published_events_go_after_the_key_window(stack) -> None:
    """An event published for workflows is kept while its key dedupes (the key window), then
    deleted by the same pass; a newer one stays."""
    old = stack.client.publish_event("order.paid", {"n": 1}, match="A", key="old", by="shop")
    new = stack.client.publish_event("order.paid", {"n": 2}, match="A", key="new", by="shop")
    window = stack.services.settings.retention.key_window_s
    with stack.services.engine.begin() as conn:
        conn.execute(
            sa.text(
                "UPDATE workflow_events SET created_at = now() - make_interval(secs => :s) "
                "WHERE id = :id"
            ),
            {"s": window + 60, "id": old},
        )
    report = run_retention(stack.services.engine, stack.services.redis, stack.services.settings)
    assert report.events == 1
    assert [r.id for r in stack.rows("SELECT id FROM workflow_events")] == [new]
