"""Watching a local deployment from outside: which worker holds which runs, which run a Teams
message started, when all are done, and whether Flower keeps strangers out.

These are the demo's polling loops; each has a deadline and reads Postgres and Redis only.
"""

from __future__ import annotations

import re
import time
from collections import Counter
from pathlib import Path
from types import TracebackType

import httpx
import sqlalchemy as sa
import structlog
from celery import Celery
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

import celeryconfig
from liyagent.local.backends import DemoError
from liyagent.local.judge import teams_end
from liyagent.local.procs import Proc
from liyagent.local.report import KillNote
from runtime import services as runtime_services
from runtime.base.sealing import Sealer
from runtime.base.settings import Settings
from runtime.entries.client import Client
from runtime.fleet.leases import Token
from store.states import FINISHED, RunStatus
from store.views import RunSummary, database_now, runs_by_ids
from tasks.services import CeleryPublisher

log = structlog.get_logger(__name__)

POLL_S = 0.05
# Kill once a run on the worker has written this many steps: mid-run, with calls behind it.
KILL_AFTER_STEP = 2
_ERROR = re.compile(r"\bERROR\b|CRITICAL|\"level\": \"(error|critical)\"")


class Deployment:
    """The app side of a deployment: its own Celery app, services and client API."""

    def __init__(self, settings: Settings, sealer: Sealer) -> None:
        """Build a Celery app and services for this deployment's settings and seal keys."""
        self.app = Celery("liyagent-demo", set_as_current=False)
        self.app.conf.update(celeryconfig.config_for(settings))
        self.services = runtime_services.build(
            settings,
            CeleryPublisher(self.app, settings.queue, settings.resumed_first),
            sealer=sealer,
        )
        self.client = Client(self.services)
        self.engine: sa.Engine = self.services.engine

    def __enter__(self) -> Deployment:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        """Close the Redis client and the Celery app's broker connections."""
        self.services.redis.close()
        self.app.close()

    def runs(self, run_ids: list[str]) -> list[RunSummary]:
        """The current summaries of these runs, from Postgres."""
        with self.engine.connect() as conn:
            return runs_by_ids(conn, run_ids)

    def holder_pid(self, run_id: str) -> int | None:
        """The pid named by the run's lease token (`<run>:<attempt>:<host>-<pid>`), if held."""
        raw = self.services.leases.holder(run_id)
        if raw is None:
            return None
        try:
            return int(Token.parse(raw).holder.rsplit("-", 1)[1])
        except (ValueError, IndexError):
            return None


def _busy_on(d: Deployment, proc: Proc, runs: list[RunSummary]) -> list[RunSummary]:
    pool = set(proc.children())
    return [r for r in runs if r.status == RunStatus.RUNNING and d.holder_pid(r.id) in pool]


def first_error(log_file: Path) -> str | None:
    """The first error line a process logged, to say why a deployment is not making progress."""
    try:
        lines = log_file.read_text(errors="replace").splitlines()
    except OSError:
        return None
    found = next((line for line in lines if _ERROR.search(line)), None)
    return None if found is None else found.strip()[:400]


def _nothing_to_kill(name: str, proc: Proc, runs: list[RunSummary], why: str) -> DemoError:
    error = first_error(proc.log)
    where = f"First error in {proc.log}: {error}" if error else f"See the logs in {proc.log.parent}"
    return DemoError(
        f"worker {name} {why}, so there was nothing to kill (runs: {_describe(runs)}). {where}"
    )


def kill_when_busy(
    d: Deployment, name: str, proc: Proc, run_ids: list[str], timeout_s: float
) -> KillNote:
    """SIGKILL `proc`'s process group once its pool holds runs, one of them past its second
    checkpoint (so its resume has recorded calls to take up); note when and which runs."""
    deadline = time.monotonic() + timeout_s
    runs: list[RunSummary] = []
    while time.monotonic() < deadline:
        runs = d.runs(run_ids)
        busy = _busy_on(d, proc, runs)
        if busy and any(r.step >= KILL_AFTER_STEP for r in busy):
            with d.engine.connect() as conn:
                at = database_now(conn)
            proc.kill()
            note = KillNote(worker=name, at=at, in_flight=[r.id for r in busy])
            log.info("demo.killed", worker=name, at=at.isoformat(), in_flight=note.in_flight)
            return note
        if not proc.alive():
            raise DemoError(f"worker {name} exited by itself; see its log {proc.log}")
        if runs and all(r.status in FINISHED for r in runs):
            raise _nothing_to_kill(name, proc, runs, "held no run before every run ended")
        time.sleep(POLL_S)
    raise _nothing_to_kill(name, proc, runs, f"held no run within {timeout_s:.0f} s")


def _describe(runs: list[RunSummary]) -> str:
    counts = Counter(r.status for r in runs)
    parts = [
        f"{status} {counts[status]}"
        for status in (RunStatus.SUCCEEDED, RunStatus.FAILED)
        if counts[status]
    ]
    parts += [f"{s} {n}" for s, n in sorted(counts.items()) if s not in FINISHED]
    resumed = sum(1 for r in runs if r.lost_count > 0)
    return f"{', '.join(parts)} | resumed {resumed}"


def wait_until_done(d: Deployment, run_ids: list[str], timeout_s: float, out: Console) -> bool:
    """Show live progress until every run is succeeded or failed; False on the deadline."""
    deadline = time.monotonic() + timeout_s
    last = ""
    with Progress(
        TextColumn("[bold]Waiting for every run to end[/]"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.description}"),
        TimeElapsedColumn(),
        console=out,
        disable=not out.is_terminal,
    ) as progress:
        task = progress.add_task("", total=len(run_ids))
        while True:
            runs = d.runs(run_ids)
            done = sum(1 for r in runs if r.status in FINISHED)
            text = _describe(runs)
            progress.update(task, completed=done, description=text)
            if not out.is_terminal and text != last:
                out.print(f"  {done}/{len(run_ids)} ended: {text}")
            last = text
            if done == len(run_ids):
                return True
            if time.monotonic() > deadline:
                out.print(f"[bold red]Deadline of {timeout_s:.0f} s passed[/]: {text}")
                return False
            time.sleep(0.25)


def teams_runs(d: Deployment, message_ids: list[str], timeout_s: float) -> dict[str, str]:
    """The run each Teams message started (message id -> run id), waiting for the inbox's
    intake (the front's, else beat's) to start them all."""
    deadline = time.monotonic() + timeout_s
    found: dict[str, str] = {}
    while True:
        with d.engine.connect() as conn:
            for message_id in message_ids:
                run_id = found.get(message_id) or teams_end(conn, message_id).run_id
                if run_id is not None:
                    found[message_id] = str(run_id)
        if len(found) == len(message_ids):
            return found
        if time.monotonic() > deadline:
            missing = ", ".join(m for m in message_ids if m not in found)
            raise DemoError(
                f"no run started within {timeout_s:.0f} s for Teams message(s) {missing}"
            )
        time.sleep(POLL_S)


def flower_guarded(url: str, user: str, password: str) -> bool:
    """Whether Flower's API refuses a request without credentials (401) and answers one with
    them (200)."""
    try:
        with httpx.Client(base_url=url, timeout=10) as http:
            anonymous = http.get("/api/workers").status_code
            signed_in = http.get("/api/workers", auth=(user, password)).status_code
    except httpx.HTTPError as exc:
        log.warning("demo.flower_unreachable", url=url, error=repr(exc))
        return False
    log.info("demo.flower_checked", anonymous=anonymous, signed_in=signed_in)
    return anonymous == 401 and signed_in == 200
