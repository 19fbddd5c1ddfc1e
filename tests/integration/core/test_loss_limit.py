"""A run lost more than twice is failed with the reason on its transcript; a run whose every
attempt ends in an error (no worker died) is failed with that error as the reason."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from tests.support.scripts import mixed
from tests.support.user_modules import install


@pytest.mark.kill
def test_run_lost_three_times_is_failed_with_the_reason(stack) -> None:
    stack.worker("ops", runs=False)  # sweeps only: every run-taking worker dies
    stack.beat()
    run_id = stack.start(mixed("l"))
    for n in range(3):
        victim = stack.worker(f"victim{n}", fault="after_claim:kill", ops=False)
        stack.fault_hit(f"victim{n}")
        victim.popen.wait(timeout=10)
    view = stack.wait(run_id, timeout=60)
    assert view.status == "failed"
    assert view.lost_count == 3
    assert "lost 3 times" in view.failure_reason
    role, text = stack.client.transcript(run_id)[-1]
    assert role == "notice" and "lost 3 times" in text
    kinds = [
        r.kind
        for r in stack.rows("SELECT kind FROM audit_events WHERE run_id = :r ORDER BY id", r=run_id)
    ]
    assert kinds.count("agent.run.lost") == 2 and kinds[-1] == "agent.run.failed"


FAILING_JOB = textwrap.dedent(
    '''
    """Acme's job that raises every time it runs: a bug, not a dying worker."""

    from liyagent import JobContext, JobParams, job


    class Params(JobParams):
        secret: str


    @job(kind="acme.always_fails", resumable=True)
    def always_fails(ctx: JobContext, params: Params) -> dict:
        """Raise, with the parameters in the message (which must reach no record)."""
        raise RuntimeError(f"cannot go on with {params.secret}")


    @job(kind="acme.fails_once")
    def fails_once(ctx: JobContext, params: Params) -> dict:
        """The same, in a kind that does not resume: its first error ends it."""
        raise RuntimeError(f"cannot go on with {params.secret}")
    '''
)


def test_an_error_on_every_attempt_fails_the_run_naming_the_error(
    stack, tmp_path: Path, monkeypatch
) -> None:
    """Each attempt raises, so each lease lapses and is claimed as a loss; the attempt that
    would be the third loss fails the run itself, saying what was raised and that it repeated,
    not that a worker died (none did)."""
    install(stack, tmp_path / "acme", monkeypatch, acme_failing_job=FAILING_JOB)
    worker = stack.worker()
    run_id = stack.client.start_job(kind="acme.always_fails", params={"secret": "CANARY-7f3a"})
    view = stack.wait(run_id, timeout=90)
    assert view.status == "failed", view
    reason = view.failure_reason or ""
    assert "its worker died" not in reason and "no worker died" in reason
    assert f"run {run_id}: an error ended each of its last 3 attempts" in reason
    assert "RuntimeError" in reason and "acme_failing_job.py" in reason
    assert "LIYAGENT_LOSS_LIMIT" in reason and "CANARY" not in reason
    assert worker.popen.poll() is None  # the worker lived through it all
    audit = stack.rows(
        "SELECT kind, attempt, detail FROM audit_events WHERE run_id = :r ORDER BY id", r=run_id
    )
    assert [a.kind for a in audit if a.kind == "agent.run.error"] == ["agent.run.error"] * 3
    assert [a.kind for a in audit if a.kind == "agent.run.lost"] == ["agent.run.lost"] * 2
    failed = audit[-1]
    assert failed.kind == "agent.run.failed" and failed.attempt == 3
    assert failed.detail["code"] == "error_repeated" and failed.detail["error"] == "RuntimeError"
    assert failed.detail["errors"] == 3
    assert not [a for a in audit if "CANARY" in str(a.detail)]
    role, text = stack.client.transcript(run_id)[-1]
    assert role == "notice" and "RuntimeError" in text and "its worker died" not in text


def test_an_error_in_a_run_that_cannot_resume_fails_it_at_once(
    stack, tmp_path: Path, monkeypatch
) -> None:
    install(stack, tmp_path / "acme", monkeypatch, acme_failing_job=FAILING_JOB)
    stack.worker()
    run_id = stack.client.start_job(kind="acme.fails_once", params={"secret": "CANARY-7f3a"})
    view = stack.wait(run_id, timeout=60)
    assert view.status == "failed" and view.attempt == 1 and view.lost_count == 0, view
    reason = view.failure_reason or ""
    assert f"run {run_id}: its attempt raised RuntimeError" in reason
    assert "it cannot resume" in reason and "no worker died" in reason
    assert "its worker died" not in reason and "CANARY" not in reason
    [failed] = stack.rows(
        "SELECT detail FROM audit_events WHERE run_id = :r AND kind = 'agent.run.failed'", r=run_id
    )
    assert failed.detail["code"] == "interrupted_by_error" and failed.detail["errors"] == 1
