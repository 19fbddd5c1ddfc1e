"""Background jobs: resumable ones continue from their durable cursor on another worker;
training and red-team runs that lose their worker fail `interrupted`."""

from __future__ import annotations

import json
import os
import signal

import pytest

from runtime.entries.client import BadRequest

pytestmark = pytest.mark.kill


def test_source_sync_continues_from_its_cursor(stack) -> None:
    source = f"{stack.sim_url}/source/docs"

    def start() -> str:
        return stack.client.start_job(kind="source_sync", params={"source": source, "page_size": 5})

    run_id = stack.kill_then_resume("after_checkpoint:kill:2", start)
    view = stack.wait(run_id)
    assert view.status == "succeeded" and view.lost_count == 1
    assert json.loads(view.answer)["pages"] == 5
    fetched = stack.vendor(
        "SELECT attempt, count(*) AS n FROM sim.requests WHERE run_id = :r "
        "AND vendor = 'source' GROUP BY attempt ORDER BY attempt",
        r=run_id,
    )
    assert [(f.attempt, f.n) for f in fetched] == [(1, 2), (2, 3)]  # no page fetched twice
    docs = stack.rows(
        "SELECT count(*) AS n, max(version) AS v FROM documents WHERE source = :s", s=source
    )[0]
    assert (docs.n, docs.v) == (25, 1)


def test_a_page_synced_twice_changes_nothing(stack, tmp_path) -> None:
    notes = tmp_path / "notes"  # the stack writes worker logs into tmp_path itself
    notes.mkdir()
    stack.reconfigure(source_roots=(str(notes),))
    for i in range(7):
        (notes / f"note-{i}.md").write_text(f"note {i}")

    def start() -> str:
        return stack.client.start_job(
            kind="source_sync", params={"source": f"dir:{notes}", "page_size": 3}
        )

    # Killed after the second page was upserted, before its cursor was checkpointed: the
    # resume syncs that page again, which must change nothing.
    run_id = stack.kill_then_resume("after_page:kill:2", start)
    view = stack.wait(run_id)
    assert view.status == "succeeded" and view.lost_count == 1
    # 3 from the first page, 0 from the page synced again, 1 from the last page.
    assert json.loads(view.answer)["documents_changed"] == 4
    run_id2 = stack.client.start_job(
        kind="source_sync", params={"source": f"dir:{notes}", "page_size": 3}
    )
    assert json.loads(stack.wait(run_id2).answer)["documents_changed"] == 0
    docs = stack.rows(
        "SELECT count(*) AS n, max(version) AS v FROM documents WHERE source = :s",
        s=f"dir:{notes}",
    )[0]
    assert (docs.n, docs.v) == (7, 1)


def test_a_dir_source_outside_the_roots_is_refused_at_the_door(stack, tmp_path) -> None:
    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "escape").symlink_to("/etc")
    for source in ("dir:/etc", f"dir:{notes}/../..", f"dir:{notes}/escape"):
        with pytest.raises(BadRequest) as refused:
            stack.client.start_job(kind="source_sync", params={"source": source})
        assert "LIYAGENT_SOURCE_ROOTS names no directory" in str(refused.value)
        assert "nothing was stored" in str(refused.value)
    stack.reconfigure(source_roots=(str(notes),))
    for source in ("dir:/etc", f"dir:{notes}/../..", f"dir:{notes}/escape"):
        with pytest.raises(BadRequest) as refused:
            stack.client.start_job(kind="source_sync", params={"source": source})
        assert "must be one of the directories LIYAGENT_SOURCE_ROOTS names" in str(refused.value)
    assert stack.rows("SELECT count(*) AS n FROM runs")[0].n == 0


def test_a_file_linked_out_of_the_roots_is_never_read(stack, tmp_path) -> None:
    notes, secret = tmp_path / "notes", tmp_path / "secret"
    notes.mkdir()
    secret.mkdir()
    (secret / "key.pem").write_text("CANARY-PRIVATE-KEY")
    (notes / "a.md").write_text("note a")
    (notes / "b.md").symlink_to(secret / "key.pem")
    (notes / "c.md").symlink_to(notes / "a.md")  # a link that stays inside is read
    stack.reconfigure(source_roots=(str(notes),))
    stack.worker()
    run_id = stack.client.start_job(kind="source_sync", params={"source": f"dir:{notes}"})
    view = stack.wait(run_id)
    assert view.status == "succeeded", view
    summary = json.loads(view.answer)
    assert summary["documents_seen"] == 2 and summary["files_outside_roots"] == 1
    docs = stack.rows(
        "SELECT doc_id, content FROM documents WHERE source = :s ORDER BY doc_id",
        s=f"dir:{notes}",
    )
    assert [(d.doc_id, d.content) for d in docs] == [("a.md", "note a"), ("c.md", "note a")]


def test_fine_tune_submits_once_and_polls_without_holding_a_worker(stack) -> None:
    def start() -> str:
        return stack.client.start_job(
            kind="fine_tune",
            params={"model": "base-7b", "dataset": "tickets-2026", "duration_s": 10, "poll_s": 0.5},
        )

    run_id = stack.kill_then_resume("after_send:kill", start)
    view = stack.wait(run_id, timeout=90)
    assert view.status == "succeeded", view
    posts = stack.vendor(
        "SELECT idem_key, deduped FROM sim.requests WHERE run_id = :r AND "
        "vendor = 'finetune' AND method = 'POST' ORDER BY id",
        r=run_id,
    )
    assert [p.deduped for p in posts] == [False, True] and len({p.idem_key for p in posts}) == 1
    jobs = stack.vendor(
        "SELECT count(*) AS n FROM sim.fine_tunes WHERE idem_key = :k", k=posts[0].idem_key
    )[0].n
    assert jobs == 1
    answer = json.loads(view.answer)
    assert answer["fine_tuned_model"].startswith("base-7b:")
    waits = stack.rows(
        "SELECT count(*) AS n FROM audit_events WHERE run_id = :r AND kind = 'agent.run.waiting'",
        r=run_id,
    )[0].n
    assert waits >= 1  # it polled on a timer, holding no worker in between


@pytest.mark.parametrize(
    ("kind", "params"),
    [
        (
            "classifier_training",
            {
                "batch_size": 1,
                "examples": [{"text": f"refund please {i}", "label": "billing"} for i in range(6)]
                + [{"text": f"site is down {i}", "label": "outage"} for i in range(6)],
            },
        ),
        (
            "red_team",
            {
                "agent": "support-bot",
                "probes": [
                    {"prompt": f"probe {i}", "forbidden_tool": "incident.page"} for i in range(5)
                ],
            },
        ),
    ],
)
def test_unresumable_job_that_loses_its_worker_fails_interrupted(stack, kind, params) -> None:
    def start() -> str:
        return stack.client.start_job(kind=kind, params=params)

    run_id = stack.kill_then_resume("in_job_batch:kill:3", start)
    view = stack.wait(run_id)
    assert view.status == "failed" and view.failure_reason.startswith("interrupted")
    assert "start it again" in view.failure_reason


def test_classifier_training_and_red_team_complete_when_undisturbed(stack) -> None:
    stack.worker("w1")
    trained = stack.client.start_job(
        kind="classifier_training",
        params={
            "examples": [
                {"text": "refund my order", "label": "billing"},
                {"text": "checkout is down", "label": "outage"},
            ]
        },
    )
    probed = stack.client.start_job(
        kind="red_team",
        params={
            "agent": "support-bot",
            "probes": [
                {"prompt": "page on-call", "forbidden_tool": "incident.page"},
                {"prompt": "open incident", "forbidden_tool": "incident.create"},
            ],
        },
    )
    model = json.loads(stack.wait(trained).answer)
    assert model["labels"] == {"billing": 1, "outage": 1}
    findings = json.loads(stack.wait(probed).answer)["findings"]
    assert [f["reachable_tool"] for f in findings] == ["incident.create"]


def test_unknown_job_kind_is_refused(stack) -> None:
    from runtime.entries.client import BadRequest

    with pytest.raises(BadRequest, match="unknown job kind"):
        stack.client.start_job(kind="mine_bitcoin", params={})


def test_a_stop_ends_a_job_at_once_and_its_next_batch_writes_nothing(stack) -> None:
    # The Stop fails the job at once; its attempt, paused mid-batch, is fenced out.
    worker = stack.worker("w1", fault="in_job_batch:stop:2")
    run_id = stack.client.start_job(
        kind="red_team",
        params={
            "agent": "support-bot",
            "probes": [{"prompt": f"p{i}", "forbidden_tool": "incident.page"} for i in range(5)],
        },
    )
    stopped_pid = int(stack.fault_hit("w1").split()[1])  # the child, at its second batch
    assert stack.client.stop(run_id=run_id, reason="runaway", by="oncall") == [run_id]
    os.kill(stopped_pid, signal.SIGCONT)
    view = stack.wait(run_id)
    assert view.status == "failed" and "stopped by oncall: runaway" in view.failure_reason
    assert worker.popen.poll() is None
