"""The picture of a run, drawn from Postgres alone, checked as a person would see it.

A real run is SIGKILLed on one worker (armed fault, the whole process group) and resumed on
another; its timeline must name both worker processes, the loss, the resume and each call's
settlement. The demo-style report, the kill-trial page and `liyagent inspect --html/--png` are
then rendered in headless Chromium (tests/support/browser.py) and judged on the rendered page.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
import sqlalchemy as sa
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.text import Text

from liyagent import timeline, timeline_marks
from liyagent.cli.main import main
from liyagent.local.figures import collect
from liyagent.local.procs import ROOT
from liyagent.local.report import KillNote, write_html
from liyagent.local.verdict import Recovery, Verdict, slowest_timelines, write_report
from runtime.entries.client import Client
from runtime.fleet.leases import Leases, Token
from runtime.recovery.deps import RecoveryDeps
from runtime.recovery.sweeper import Sweeper
from store import db
from store.losses import claim_lost_many
from store.rows import RunNotFound
from store.runs import claim_delivery, hand_back
from store.timeline import Timeline, select_timeline, select_timelines
from store.views import database_now
from tests.support import browser
from tests.support.scripts import final, mixed
from tests.support.stack import RecordingPublisher, services_with

# Killed after marking its third write (chat.reply, no reader) and before sending it: the
# resume cannot know whether it landed, so it is settled `unknown` and never sent again.
FAULT = "after_mark:kill:3"


def _killed_and_resumed(stack) -> tuple[str, str, list[int], KillNote]:
    """A run killed on `victim` and resumed on `survivor`, and a run that was never lost;
    returns both ids, the victim's pool pids and the kill (by the database clock)."""
    victim = stack.worker("victim", fault=FAULT, pool="prefork")  # its pool children's pids
    pool = victim.children()
    killed = stack.start(mixed("k", latency_ms=200))
    stack.fault_hit("victim")
    victim.popen.wait(timeout=10)
    with stack.db() as conn:
        at = database_now(conn)
    stack.worker("survivor")
    stack.beat()
    assert stack.wait(killed).status == "succeeded"
    # Started once the killed run has ended: a first attempt running while a lost run waits
    # in the queue is asked to yield its slot to it (resumed runs first), and this one must
    # never be handed back.
    calm = stack.start(mixed("c"))
    assert stack.wait(calm).status == "succeeded"
    return killed, calm, pool, KillNote(worker="victim", at=at, in_flight=[killed])


def _check_timeline(t: Timeline, pool: list[int]) -> None:
    """The killed run's story, as Postgres recorded it."""
    host = socket.gethostname()
    first, second = t.attempts
    assert (first.attempt, first.end, second.attempt, second.end) == (1, "lost", 2, "succeeded")
    assert first.holder in {f"{host}-{pid}" for pid in pool}
    assert second.holder is not None and second.holder != first.holder
    (loss,) = t.losses
    assert loss.attempt == 1 and loss.worker == first.holder and loss.at == first.ended_at
    assert first.claimed_at is not None and first.last_record_at is not None
    assert second.claimed_at is not None and t.answered_at is not None
    assert first.claimed_at < first.last_record_at < loss.at < second.claimed_at < t.answered_at
    (resume,) = t.resumes
    assert resume.attempt == 2 and resume.worker == second.holder
    assert [(c.tool, c.settled) for c in resume.calls] == [("chat.reply", "unknown")]
    outcomes = [(c.tool, c.outcome) for c in t.calls]
    assert outcomes == [
        ("incident.create", "made"),
        ("issue.comment", "made"),
        ("chat.reply", "unknown"),
    ]
    chat = t.calls[-1]
    # Marked by the lost attempt, settled by its successor.
    assert chat.marked_at <= first.last_record_at and chat.settled_at is not None
    assert chat.settled_at > second.claimed_at


def _svg_of(rendered: browser.Rendered, run_id: str) -> dict[str, object]:
    (found,) = [s for s in rendered.probe["svgs"] if s["id"] == f"timeline-{run_id}"]
    return found


def _check_drawn(rendered: browser.Rendered, run_id: str, kill_label: str) -> None:
    """The run's picture was laid out, with its kill, loss, resume, answer and settlements."""
    svg = _svg_of(rendered, run_id)
    width, height = svg["size"]  # type: ignore[misc]
    assert width > 600 and height > 200, svg["size"]
    text = str(svg["text"])
    for words in (kill_label, "attempt 1 lost", "chat.reply: unknown", "worker killed",
                  "resumed", "answer stored", "seconds since the run was created",
                  f"run {run_id}"):  # fmt: skip
        assert words in text, words
    ids = " ".join(svg["ids"])  # type: ignore[arg-type]
    for gid in ("-kill", "-loss-1", "-resume-2", "-claim-2", "-answer", "-call-3-0-settled"):
        assert gid in ids, gid
    assert all(i["complete"] and i["width"] > 0 for i in rendered.probe["images"])
    counts = browser.colours(rendered.screenshot)
    assert len(counts) > 50, "the screenshot is (nearly) blank"
    for colour in (
        timeline_marks.LOSS,
        timeline_marks.colour("made"),
        timeline_marks.colour("unknown"),
    ):
        assert browser.near(counts, colour) > 20, f"{colour} is not on the screen"


@pytest.mark.kill
@pytest.mark.timeout(240)
def test_killed_run_timeline_in_reports(stack, tmp_path: Path) -> None:
    browser.chromium()  # skip (or fail in CI) before killing anything
    killed, calm, pool, kill = _killed_and_resumed(stack)
    with stack.db() as conn:
        t = select_timeline(conn, killed)
        timelines = select_timelines(conn, [killed, calm])
    _check_timeline(t, pool)
    assert [x.run_id for x in timelines] == [killed, calm]
    assert timelines[1].losses == () and [a.end for a in timelines[1].attempts] == ["succeeded"]

    # The demo's report: every run in its table, the resumed one's timeline, and only that.
    figures = collect(stack.engine, stack.sim_engine, [killed, calm], {killed}, kill.at)
    page = write_html(tmp_path / "demo.html", figures, kill, ["test"], timelines)
    rendered = browser.render(page, tmp_path)
    assert killed in rendered.dom and calm in rendered.dom
    assert [s["id"] for s in rendered.probe["svgs"]] == [f"timeline-{killed}"]
    assert f'href="#timeline-{killed}"' in rendered.dom
    _check_drawn(rendered, killed, "victim SIGKILLed")

    # The kill trials' page: the histogram (an embedded PNG) and the slowest timelines.
    assert t.finished_at is not None
    recovery = Recovery("webhook:k", killed, kill.at, (t.finished_at - kill.at).total_seconds())
    verdict = Verdict(trials=1, rounds=1, caught_in_flight=1, recovery_s=[recovery.seconds])
    with stack.db() as conn:
        verdict.slowest = slowest_timelines(conn, [recovery])
    png = write_report(verdict, tmp_path / "trials.json", {"recovery_bound_s": 15.0})
    report = json.loads((tmp_path / "trials.json").read_text())
    assert report["timelines_page"] == "trials.html" and png == tmp_path / "trials.png"
    assert report["slowest_recoveries"][0]["run_id"] == killed
    rendered = browser.render(tmp_path / "trials.html", tmp_path)
    (image,) = rendered.probe["images"]
    assert image["alt"] == "recovery histogram" and image["width"] > 300
    _check_drawn(rendered, killed, "victim SIGKILLed")

    # On demand: `liyagent inspect RUN --html FILE --png FILE`.
    done = subprocess.run(
        [sys.executable, "-m", "liyagent.cli.main", "inspect", killed, "--json",
         "--html", str(tmp_path / "run.html"), "--png", str(tmp_path / "run.png")],
        env=stack.env, cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    files = json.loads(done.stdout)["timeline_files"]
    assert files == {"html": str(tmp_path / "run.html"), "png": str(tmp_path / "run.png")}
    assert (tmp_path / "run.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    counts = browser.colours(tmp_path / "run.png")
    assert browser.near(counts, timeline.LOSS) > 20
    assert browser.near(counts, timeline_marks.colour("unknown")) > 20
    human = subprocess.run(
        [sys.executable, "-m", "liyagent.cli.main", "inspect", killed,
         "--png", str(tmp_path / "again.png")],
        env={**stack.env, "COLUMNS": "300"}, cwd=ROOT, capture_output=True, text=True,
        timeout=120,
    )  # fmt: skip
    assert human.returncode == 0, human.stderr[-3000:]
    assert f"Timeline (PNG): {tmp_path / 'again.png'}" in human.stdout
    assert (tmp_path / "again.png").stat().st_size > 10_000
    rendered = browser.render(tmp_path / "run.html", tmp_path)
    svg = _svg_of(rendered, killed)
    assert "attempt 1 lost" in str(svg["text"]) and "SIGKILL" not in str(svg["text"])


@pytest.mark.parametrize(
    "flag, value, message",
    [
        ("--html", "{tmp}/missing/run.html", "does not exist"),
        ("--png", "{tmp}", "is a folder"),
    ],
)
def test_inspect_refuses_bad_picture_paths(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], flag: str, value: str, message: str
) -> None:
    path = value.format(tmp=tmp_path)
    code = main(["inspect", str(uuid.uuid4()), flag, path])
    assert code == 2
    err = capsys.readouterr().err
    assert message in err and flag in err and "Traceback" not in err
    assert list(tmp_path.iterdir()) == []


def test_timeline_of_a_run_lost_handed_back_and_failed_at_the_limit(db_url: str) -> None:
    """Driven through the store's own guarded statements (no worker): lost on host-a, handed
    back by host-b, lost again on host-a past the limit. The run's row still names host-a's
    claim after the last loss; the timeline must not give it to the attempt nobody claimed."""
    engine = db.create(db_url)
    run_id = str(uuid.uuid4())
    try:
        with engine.connect() as conn:
            conn.execute(
                sa.text(
                    "INSERT INTO runs (id, correlation_id, agent, owner) "
                    "VALUES (:id, :corr, 'support-bot', 'tester')"
                ),
                {"id": run_id, "corr": run_id},
            )
            assert claim_delivery(conn, run_id, 1, "host-a") is not None
            assert claim_lost_many(conn, [(run_id, 1)], loss_limit=1)[0].status == "queued"
            assert claim_delivery(conn, run_id, 2, "host-b") is not None
            hand_back(conn, run_id, 2, "host-b")
            assert claim_delivery(conn, run_id, 3, "host-a") is not None
            assert claim_lost_many(conn, [(run_id, 3)], loss_limit=1)[0].status == "failed"
            t = select_timeline(conn, run_id)
            with pytest.raises(RunNotFound):
                select_timeline(conn, str(uuid.uuid4()))
    finally:
        engine.dispose()

    ends = [(a.attempt, a.holder, a.end) for a in t.attempts]
    assert ends == [
        (1, "host-a", "lost"),
        (2, "host-b", "handed_back"),
        (3, "host-a", "lost"),
        (4, None, "failed"),
    ]
    first, _, third, fourth = t.attempts
    assert first.claimed_at is not None and third.claimed_at is not None
    assert fourth.claimed_at is None and fourth.began_at is None
    assert [(e.kind, e.attempt, e.code) for e in t.losses] == [
        ("agent.run.lost", 1, None),
        ("agent.run.failed", 3, "loss_limit"),
    ]
    assert t.status == "failed" and t.calls == ()
    # Drawn without a worker for attempt 4, with both losses and the failure.
    svg = timeline.svg(t)
    assert "attempt 1 lost" in svg and "attempt 3 lost" in svg and "failed the run" in svg
    assert "worker host-b" in svg and "handed back" in svg
    assert timeline.png_bytes(t)[:4] == b"\x89PNG"


def _title_in_frame(t: Timeline) -> str:
    """The picture's title, checked against the figure's frame with the renderer that draws
    the PNG: inside the figure, above the axes, and whole words (none cut)."""
    fig = timeline.draw(t)
    renderer = FigureCanvasAgg(fig).get_renderer()
    fig.draw(renderer)
    (title,) = [a for a in fig.findobj(Text) if f"run {t.run_id}" in a.get_text()]
    box, frame = title.get_window_extent(renderer), fig.bbox
    assert frame.x0 <= box.x0 and box.x1 <= frame.x1, (box, frame)
    assert frame.y0 <= box.y0 and box.y1 <= frame.y1, (box, frame)
    (ax,) = fig.axes
    assert box.y0 >= ax.get_window_extent(renderer).y1, "the title runs into the axes"
    return str(title.get_text())


def test_a_long_title_fits_its_frame_and_a_sweeper_claim_is_credited_to_it(
    stack, tmp_path: Path
) -> None:
    """A run whose worker took its lease and died, claimed by a real sweep once the lease
    lapsed, with an agent name as long as a team's: the loss names the sweeper, and the title
    wraps inside the picture."""
    services = services_with(stack, RecordingPublisher())
    agent = "acme-support-escalations-bot-for-the-emea-region"
    run_id = Client(services).start_run(
        agent=agent, model={"script": {"steps": [final()]}}, user_input="x"
    )
    short = Leases(services.redis, services.settings.namespace, ttl_ms=150)
    assert short.acquire(Token(run_id, 1, "host-a-1"))
    with stack.db() as conn:
        assert claim_delivery(conn, run_id, 1, "host-a-1") is not None
    deadline = time.monotonic() + 5
    while short.holder(run_id) is not None:
        assert time.monotonic() < deadline, "the lease never lapsed"
        time.sleep(0.02)
    assert Sweeper(RecoveryDeps.of(services)).sweep().ran
    with stack.db() as conn:
        t = select_timeline(conn, run_id)
    (loss,) = t.losses
    assert loss.seen == "lease_lapsed" and loss.claimer == "the sweeper"
    text = _title_in_frame(t)
    for words in (f"run {run_id}", agent, "queued", "2 attempts, lost once"):
        assert words in text, words
    assert "attempt 1 lost (lease lapsed): the sweeper requeued the run" in timeline.svg(t)
    png = timeline.write_png(tmp_path / "long.png", t)
    assert png.read_bytes()[:4] == b"\x89PNG"


@pytest.mark.kill
@pytest.mark.timeout(120)
def test_a_death_watch_claim_is_credited_to_the_death_watch(stack) -> None:
    """The survivor runs no sweeps: the survivor's death watch sees the victim's connections
    close and claims the run. The picture and its timeline say so, never "the sweeper"."""
    run_id = stack.kill_at("after_checkpoint:kill", lambda: stack.start(mixed("dw")))
    stack.worker("survivor", sweeps=False)
    assert stack.wait(run_id).status == "succeeded"
    with stack.db() as conn:
        t = select_timeline(conn, run_id)
    (loss,) = t.losses
    assert loss.seen == "connection_closed" and loss.claimer == "the death watch"
    svg = timeline.svg(t)
    assert "attempt 1 lost (connection closed): the death watch requeued the run" in svg
    assert "sweeper" not in svg
    _title_in_frame(t)
