"""`liyagent trials`: the kill trials for operators, outside pytest.

It finds (or starts) Postgres and Redis as the demo does, runs the rounds of
`liyagent.local.trials` with the product's timings, prints the verdict and writes the JSON report
with its PNG histogram. Everything it started is stopped on the way out, even on Ctrl-C.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import tempfile
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import redis
import sqlalchemy as sa
import structlog
from rich.console import Console

from liyagent.cli.common import OK, USAGE, CliError, add_json, print_json
from liyagent.local.cluster import POOLS
from liyagent.local.procs import sigterm_as_interrupt
from liyagent.local.verdict import RECOVERY_BOUND_S
from runtime.base import logs
from runtime.base.settings import Timings

# The harness pulls in Celery, the services and matplotlib: imported when the command runs,
# so the other sub-commands start as fast as before.
if TYPE_CHECKING:
    from liyagent.local.backends import Backends
    from liyagent.local.trials import TrialDeployment, TrialOptions
    from liyagent.local.verdict import Verdict

DEFAULT_DATABASE = "liyagent_trials"
DEFAULT_TRIALS = 90
MAX_TRIALS = 3000
# The spec's bound: a trial caught in flight that ends later than this after its kill fails.
RECOVERY_TARGET_S = RECOVERY_BOUND_S
# The product's own timings, as tests/trials/test_kill_trials.py runs them: the trials prove
# what a deployment gets, nothing tuned for them.
TRIAL_TIMINGS = Timings()
INTERRUPTED = 130


@dataclass(frozen=True)
class TrialsRequest:
    """What to run: how many trials, which seed, where the report goes."""

    trials: int = DEFAULT_TRIALS
    seed: int | None = None
    report: Path | None = None
    database: str = DEFAULT_DATABASE
    # Drop the trials database at the end when it was made on the machine's server (benches).
    drop_database: bool = False
    # The workers' Celery pool (-P).
    pool: str = "prefork"


@dataclass
class TrialsOutcome:
    """The verdict, where its report and histogram are, the JSON result and the exit code."""

    verdict: Verdict
    report: Path
    histogram: Path
    result: dict[str, Any]
    code: int


@dataclass
class _State:
    """What one invocation started, for the result and for cleaning up."""

    log_dir: Path
    backends: Backends
    vendor_db: str
    options: TrialOptions
    report: Path
    vendor_admin: str | None = None
    deployment: TrialDeployment | None = None
    pids: set[int] = field(default_factory=set)


def cmd_trials(args: argparse.Namespace) -> int:
    """Run the kill trials; exit 0 when nothing was lost, duplicated or written stale, else 1."""
    from liyagent.local.backends import DemoError

    request = _request(args)
    console = Console(stderr=args.json, highlight=False)
    try:
        outcome = execute(request, console)
    except DemoError as exc:
        return _failed(args.json, console, str(exc), exc.exit_code)
    except (sa.exc.OperationalError, redis.exceptions.ConnectionError) as exc:
        why = str(getattr(exc, "orig", None) or exc).strip().splitlines()[0]
        return _failed(args.json, console, f"lost Postgres or Redis during the trials: {why}", 3)
    except KeyboardInterrupt:
        console.print("Interrupted: stopped everything the trials started.")
        if args.json:
            print_json({"error": "interrupted"})
        return INTERRUPTED
    if args.json:
        print_json(outcome.result)
    return outcome.code


def _request(args: argparse.Namespace) -> TrialsRequest:
    """The request from the command line; out-of-range numbers are bad usage (exit 2)."""
    if not 1 <= args.trials <= MAX_TRIALS:
        raise CliError(f"--trials must be between 1 and {MAX_TRIALS}", USAGE)
    if args.seed is not None and args.seed < 0:
        raise CliError("--seed must be 0 or more", USAGE)
    if args.pool not in POOLS:  # a default from LIYAGENT_TRIALS_POOL is not checked by argparse
        raise CliError(f"--pool (LIYAGENT_TRIALS_POOL) must be one of {', '.join(POOLS)}", USAGE)
    return TrialsRequest(
        trials=args.trials,
        seed=args.seed,
        report=None if args.report is None else Path(args.report),
        database=os.environ.get("LIYAGENT_TRIALS_DATABASE") or DEFAULT_DATABASE,
        pool=args.pool,
    )


def _failed(as_json: bool, console: Console, message: str, code: int) -> int:
    """Report a failure that ended the trials early, on stderr (and as JSON if asked)."""
    console.print(f"[bold red]error:[/] {message}")
    if as_json:
        print_json({"error": message})
    return code


def execute(request: TrialsRequest, console: Console) -> TrialsOutcome:
    """Start servers and deployment, run and judge the trials, write the report; whatever
    happens, stop and remove what was started (processes, simulator database, Redis keys)."""
    from liyagent.local.backends import Backends
    from liyagent.local.trials import TrialOptions

    report, tag = _report_path(request), uuid.uuid4().hex[:12]
    state = _State(
        log_dir=Path(tempfile.mkdtemp(prefix="liyagent-trials-")),
        backends=Backends(namespace=f"trials:{tag}:"),
        vendor_db=f"liyagent_trials_sim_{tag}",
        options=TrialOptions(trials=request.trials, seed=request.seed, pool=request.pool),
        report=report,
    )
    console.print(f"[bold]liyagent kill trials[/]: {request.trials} trials, -P {request.pool}")
    console.print(f"  Logs of every process: {state.log_dir}")
    with _logs_to(state.log_dir / "trials.log"):
        try:
            with sigterm_as_interrupt():
                deployment = _start(state, request, console)
                verdict = _run(deployment, state.options, console)
        finally:
            _cleanup(state, request, console)
    return _finish(verdict, request, state, console)


def _report_path(request: TrialsRequest) -> Path:
    """Where the report goes; its folder is made now, so a bad path fails before any trial."""
    from liyagent.local.backends import DemoError

    stamp = datetime.now(UTC).strftime("%Y%m%d-%H%M%S")
    path = request.report or Path("reports") / f"kill-trials-{stamp}.json"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise DemoError(f"cannot write the report to {path}: {exc.strerror}", USAGE) from None
    if path.is_dir():
        raise DemoError(f"--report {path} is a folder; name the JSON file", USAGE)
    return path


def _start(state: _State, request: TrialsRequest, console: Console) -> TrialDeployment:
    """Servers, the trials and simulator databases, the simulator, survivor, beat and front."""
    from liyagent.local.backends import open_backends
    from liyagent.local.trials import TrialDeployment
    from runtime.base.sealing import new_key_entry, parse_keys
    from runtime.base.settings import Settings
    from store import admin

    b = open_backends(state.backends, request.database)
    for note in b.notes:
        console.print(f"  {note}")
    _create_vendor_database(state)
    seal_keys = new_key_entry("trials")
    settings = Settings(
        database_url=b.database_url,
        redis_url=b.redis_url,
        redis_master=b.redis_master,
        namespace=b.namespace,
        timings=TRIAL_TIMINGS,
    )
    state.deployment = TrialDeployment(
        settings=settings,
        seal_keys=seal_keys,
        sealer=parse_keys(seal_keys),
        vendor_db_url=admin.database_url(b.database_url, state.vendor_db),
        log_dir=state.log_dir,
    )
    t = TRIAL_TIMINGS
    console.print(
        f"  Timings (the product's): lease {t.lease_ttl_ms / 1000:g} s, sweep every "
        f"{t.sweep_interval_ms / 1000:g} s; kills {state.options.kill_window_s[0]:g}-"
        f"{state.options.kill_window_s[1]:g} s after a victim is up"
    )
    state.deployment.start(state.options)
    return state.deployment


def _create_vendor_database(state: _State) -> None:
    """The simulator's own database for its records, on the trials' server (dropped at the end)."""
    from liyagent.local.backends import DemoError, safe_url
    from store import admin

    url = state.backends.database_url
    try:
        admin.create_database(url, state.vendor_db)
    except sa.exc.ProgrammingError as exc:
        why = str(exc.orig).strip().splitlines()[0]
        raise DemoError(
            f"cannot create the simulator's database {state.vendor_db} on {safe_url(url)} "
            f"({why}); the trials need a role that may create databases"
        ) from None
    state.vendor_admin = url


def _run(deployment: TrialDeployment, options: TrialOptions, console: Console) -> Verdict:
    """The rounds under a progress bar, then the wait for every trial to end, then the judge."""
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        SpinnerColumn,
        TextColumn,
        TimeElapsedColumn,
    )

    from liyagent.local.trials import run_trials

    rounds = -(-options.trials // 3)
    columns = (
        SpinnerColumn(),
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
    )
    with Progress(*columns, console=console) as progress:
        task = progress.add_task("kill rounds", total=rounds)

        def on_round(done: int, total: int) -> None:
            progress.update(task, completed=done, total=total)
            if done == total:
                progress.update(task, description="waiting for every trial to end")

        return run_trials(deployment, options, on_round=on_round)


def _cleanup(state: _State, request: TrialsRequest, console: Console) -> None:
    """Stop the processes, drop the simulator's (and if asked the trials') database, delete
    the Redis namespace and stop any private server."""
    from liyagent.local.backends import MACHINE_PG_ADMIN, close_backends

    d = state.deployment
    if d is not None and hasattr(d, "cluster"):
        state.pids = set(d.cluster.pids)
        d.stop()
        if hasattr(d, "services"):
            d.services.engine.dispose()
    if state.vendor_admin is not None:
        _drop(state.vendor_admin, state.vendor_db, console)
    created = state.backends.created_database
    if request.drop_database and created is not None:
        _drop(MACHINE_PG_ADMIN, created, console)
    close_backends(state.backends)
    if state.pids:
        console.print("Stopped every process the trials started; deleted their Redis keys.")


def _drop(admin_url: str, name: str, console: Console) -> None:
    """Drop a database the trials made; if that fails, say so and go on cleaning up."""
    from store import admin

    try:
        admin.drop_database(admin_url, name)
    except sa.exc.SQLAlchemyError as exc:
        why = str(getattr(exc, "orig", None) or exc).strip().splitlines()[0]
        console.print(f"[yellow]warning:[/] could not drop the database {name} ({why})")


def _finish(
    verdict: Verdict, request: TrialsRequest, state: _State, console: Console
) -> TrialsOutcome:
    """Write the report and histogram, print the verdict, and decide the exit code."""
    from liyagent.local.verdict import summary_line, write_report

    path = state.report
    png = write_report(verdict, path, _report_extra(state.options))
    slow = verdict.slow(RECOVERY_TARGET_S)
    passed = verdict.passed(RECOVERY_TARGET_S)
    console.print(f"kill trials: {summary_line(verdict)}")
    if slow:
        console.print(
            f"[red]recovery over {RECOVERY_TARGET_S:g} s[/] (the spec's bound) in {len(slow)} "
            f"of {len(verdict.recoveries)} trials caught in flight (max "
            f"{max(r.seconds for r in slow):.3f} s): "
            + ", ".join(f"{r.trial} {r.seconds:.1f} s" for r in slow[:5])
        )
    if verdict.caught_in_flight == 0:
        console.print("[yellow]warning:[/] no victim had work in flight when it died")
    console.print("[bold green]PASS[/]" if passed else "[bold red]FAIL[/]")
    console.print(f"Report: {path}  Histogram: {png}  Timelines: {path.with_suffix('.html')}")
    result = {
        **json.loads(path.read_text()),
        "report": str(path.resolve()),
        "histogram": str(png.resolve()),
        "log_dir": str(state.log_dir),
        "namespace": state.backends.namespace,
        "pids": sorted(state.pids),
    }
    return TrialsOutcome(verdict, path, png, result, OK if passed else 1)


def _report_extra(options: TrialOptions) -> dict[str, Any]:
    """The set-up the report records beside the verdict (the commit and every timing)."""
    from liyagent.local.verdict import report_extra

    return report_extra(TRIAL_TIMINGS, options)


@contextlib.contextmanager
def _logs_to(path: Path) -> Iterator[None]:
    """This process's structured logs go to `path` while the trials run (the terminal shows
    progress), and back to stderr afterwards."""
    with open(path, "a") as fh:
        structlog.configure(
            processors=[
                structlog.processors.add_log_level,
                structlog.processors.TimeStamper(fmt="iso", utc=True),
                structlog.processors.format_exc_info,
                structlog.processors.JSONRenderer(),
            ],
            wrapper_class=structlog.make_filtering_bound_logger(logging.INFO),
            logger_factory=structlog.PrintLoggerFactory(file=fh),
            cache_logger_on_first_use=False,
        )
        try:
            yield
        finally:
            logs.configure(level=os.environ.get("LIYAGENT_LOG_LEVEL") or "WARNING")


def _trials(p: argparse.ArgumentParser) -> None:
    """The `trials` sub-command's options."""
    p.description = (
        "Start a simulator, a survivor worker, beat and the app front, then in each round a "
        "fresh victim worker that begins a cron fire, a Teams turn and a webhook call and is "
        "SIGKILLed 0.2-4 s after it is up; judge every trial from Postgres and the vendors' "
        "records. Uses LIYAGENT_DATABASE_URL and LIYAGENT_REDIS_URL when set, else the "
        "machine's servers on their default ports (creating the database "
        "LIYAGENT_TRIALS_DATABASE, default liyagent_trials), else private ones; the "
        "simulator records into a database of its own, dropped at the end. Exit 0 when no "
        "trial was lost and no write was duplicated or made after a takeover, 1 otherwise, "
        "2 on bad usage, 3 without Postgres or Redis."
    )
    p.add_argument(
        "--trials", type=int, default=DEFAULT_TRIALS, help=f"trials (default {DEFAULT_TRIALS})"
    )
    p.add_argument("--seed", type=int, help="repeat the kill timings of an earlier seed")
    p.add_argument(
        "--pool",
        choices=POOLS,
        default=os.environ.get("LIYAGENT_TRIALS_POOL") or "prefork",
        help="the workers' Celery pool (-P; default LIYAGENT_TRIALS_POOL, else prefork)",
    )
    p.add_argument(
        "--report",
        help="JSON report path (default reports/kill-trials-<timestamp>.json); the PNG "
        "histogram and an HTML page with the slowest recoveries' timelines go beside it",
    )
    add_json(p)
    p.set_defaults(handler=cmd_trials)


ARGUMENTS: dict[str, Callable[[argparse.ArgumentParser], None]] = {"trials": _trials}
