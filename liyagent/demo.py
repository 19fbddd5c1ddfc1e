"""The crash-resume demo: two real workers, one SIGKILLed mid-batch, every run resumed.

It finds (or starts) Postgres and Redis, starts the vendor simulator, two prefork workers, beat,
the app front and Flower with the default timings, enqueues a mixed batch (client API runs, Teams
turns and webhook calls through the front), kills worker w1 while it holds runs, waits for every
run to end and reports the verdict from Postgres and the vendor's records. Everything it started
is stopped on the way out, even on Ctrl-C. The secrets it makes (the front's token, Flower's
password, the seal key) are written to a file of mode 0600 in its log directory and shown only
masked.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import shlex
import sys
import tempfile
import uuid
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TextIO

import redis
import sqlalchemy as sa
import structlog
from rich.console import Console

from liyagent.local import batch, sim_model
from liyagent.local.backends import Backends, DemoError, close_backends, open_backends, safe_url
from liyagent.local.botframework import BotChannel
from liyagent.local.cluster import Cluster, child_env
from liyagent.local.figures import Figures, collect
from liyagent.local.procs import sigterm_as_interrupt
from liyagent.local.report import KillNote, runs_table, runs_word, summary_table, write_html
from liyagent.local.secret_file import masked, write_secrets
from liyagent.local.watch import (
    Deployment,
    flower_guarded,
    kill_when_busy,
    teams_runs,
    wait_until_done,
)
from runtime.base.sealing import new_key_entry, parse_keys
from runtime.base.settings import Settings, Timings
from runtime.entries.client import Client
from store.timeline import Timeline, select_timelines

log = structlog.get_logger(__name__)

DEFAULT_DATABASE = "liyagent_demo"
IN_FLIGHT_TIMEOUT_S = 60.0
# How long the Teams inbox may take to start a message's run (beat's intake is the fallback).
TEAMS_INTAKE_TIMEOUT_S = 30.0
FLOWER_USER = "demo"
# In the log directory: the secrets the demo made, as shell assignments, mode 0600.
SECRETS_FILE = "demo-secrets.env"


@dataclass(frozen=True)
class DemoOptions:
    """What the user asked for on the command line."""

    runs: int = 8
    json: bool = False
    timeout_s: float = 120.0
    report_dir: Path = Path("reports")
    private: bool = False
    database: str = DEFAULT_DATABASE


@dataclass
class DemoState:
    """What the demo started and learned, for the summary and for cleaning up."""

    log_dir: Path
    backends: Backends
    seal_keys: str = ""
    cluster: Cluster | None = None
    run_ids: list[str] = field(default_factory=list)
    # Runs the front started: run id -> teams or webhook (the rest came through the client).
    via: dict[str, str] = field(default_factory=dict)
    kill: KillNote | None = None
    front_url: str = ""
    flower_url: str = ""
    flower_password: str = field(default_factory=lambda: secrets.token_urlsafe(12))
    flower_checked: bool = False
    # Where the secrets above are written (SECRETS_FILE in the log directory).
    secrets_file: Path | None = None
    # Every run's timeline, read from Postgres before the deployment stops (the report draws
    # the resumed ones).
    timelines: list[Timeline] = field(default_factory=list)
    # The Bot Framework channel the Teams turns come through (its keys served on loopback).
    channel: BotChannel = field(default_factory=BotChannel)


def _log_to(path: Path) -> TextIO:
    """Send this process's structured logs to `path` (JSON lines), keeping the terminal clear."""
    fh = open(path, "a")  # noqa: SIM115 - closed by the caller when the demo ends
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
    return fh


def _settings(state: DemoState) -> Settings:
    """The deployment's settings: its servers, the default timings, the built-in vendor tools,
    the demo's agent catalog (written into the log directory once the simulators' model serves
    its scripts) and a fresh bearer token for the front."""
    agents = state.log_dir / "demo-agents.json"
    return Settings(
        database_url=state.backends.database_url,
        redis_url=state.backends.redis_url,
        redis_master=state.backends.redis_master,
        namespace=state.backends.namespace,
        timings=Timings(),
        agents_file=str(agents),
        front_token=secrets.token_urlsafe(24),
        tool_modules=sim_model.TOOLS,
    )


def _start_front_and_flower(state: DemoState, env: dict[str, str], out: Console) -> None:
    """The app front (Teams inbox, webhooks) and Flower (behind basic auth)."""
    assert state.cluster is not None
    state.channel.start()
    state.front_url = state.cluster.front({**env, **state.channel.env(batch.TEAMS_AGENT)})
    state.flower_url = state.cluster.flower(env, FLOWER_USER, state.flower_password)
    say_front_and_flower(state, env["LIYAGENT_FRONT_TOKEN"], out)


def keep_secrets(state: DemoState, front_token: str) -> Path:
    """Write the demo's secrets to SECRETS_FILE in its log directory (mode 0600), as shell
    assignments, so the user can use them without the terminal ever showing them."""
    state.secrets_file = write_secrets(
        state.log_dir / SECRETS_FILE,
        {
            "LIYAGENT_FRONT_TOKEN": front_token,
            "LIYAGENT_DEMO_FLOWER_USER": FLOWER_USER,
            "LIYAGENT_DEMO_FLOWER_PASSWORD": state.flower_password,
            "LIYAGENT_SEAL_KEYS": state.seal_keys,
            # May carry a password; and what `liyagent inspect` needs with the seal key.
            "LIYAGENT_DATABASE_URL": state.backends.database_url,
        },
    )
    return state.secrets_file


def say_front_and_flower(state: DemoState, front_token: str, out: Console) -> None:
    """Where the front and Flower answer and how to get in: each secret masked (its first
    characters and its length), and the file holding it in clear."""
    out.print(f"  App front (Teams inbox, webhooks): {state.front_url}")
    out.print(
        f"    Authorization: Bearer {masked(front_token)}, LIYAGENT_FRONT_TOKEN in the secrets file"
    )
    out.print(f"  Flower (live until the demo ends): {state.flower_url}")
    out.print(
        f"    user {FLOWER_USER}, password {masked(state.flower_password)}, "
        "LIYAGENT_DEMO_FLOWER_PASSWORD in the secrets file"
    )
    out.print(f"  Secrets file: {state.secrets_file} (mode 0600; `. FILE` sets them)")


def _start(state: DemoState, opts: DemoOptions, out: Console) -> Settings:
    """Servers, database, seal key, simulator, two workers, beat, the front and Flower;
    returns the settings."""
    open_backends(state.backends, opts.database, force_private=opts.private)
    for note in state.backends.notes:
        out.print(f"  {note}")
    state.seal_keys = new_key_entry("demo")
    state.cluster = cluster = Cluster(state.log_dir)
    base = _settings(state)
    keep_secrets(state, base.front_token)
    sim_url = cluster.simulator(base.database_url, child_env(base, state.seal_keys))
    catalog = Path(base.agents_file)
    catalog.write_text(json.dumps(sim_model.served(sim_url, batch.catalog()), indent=2) + "\n")
    settings = replace(base, vendor_url=sim_url, model_profiles=sim_model.profiles(sim_url))
    # The workers reply to Teams turns as the channel's bot, with its token from the simulators.
    env = {**child_env(settings, state.seal_keys), **state.channel.worker_env(sim_url)}
    t = settings.timings
    out.print(
        f"  Timings (the defaults): lease {t.lease_ttl_ms / 1000:g} s, heartbeat "
        f"{t.heartbeat_ms / 1000:g} s, sweep every {t.sweep_interval_ms / 1000:g} s"
    )
    for name in ("w1", "w2"):
        proc = cluster.worker(name, settings.queue, env)
        out.print(f"  Worker {name}: pid {proc.popen.pid}, pool {proc.children()}")
    cluster.beat(env)
    out.print(f"  Vendor simulator at {sim_url}; beat fires the sweeper")
    _start_front_and_flower(state, env, out)
    return settings


def _start_api_run(client: Client, run: batch.BatchRun) -> str:
    return client.start_run(
        agent=batch.AGENT,
        model=sim_model.register(client.s.settings.vendor_url, run.script["steps"]),
        user_input=run.user_input,
        tools=batch.TOOLS,
        request_key=run.request_key,
    )


def _enqueue(d: Deployment, state: DemoState, opts: DemoOptions, out: Console) -> None:
    """Start the batch: API runs through the client, each with its own request key; Teams
    messages and webhook calls through the front, as a chat or a monitor would."""
    tag = state.backends.namespace.split(":")[1][:8]
    messages: list[str] = []
    token = d.services.settings.front_token
    with batch.front_client(state.front_url, token) as http:
        for item in batch.batch(opts.runs, tag):
            if isinstance(item, batch.BatchRun):
                state.run_ids.append(_start_api_run(d.client, item))
            elif (
                run_id := batch.post_entry(
                    http, item, state.channel, d.services.settings.vendor_url
                )
            ) is not None:
                state.run_ids.append(run_id)
                state.via[run_id] = item.via
            else:
                messages.append(item.ref)
    for run_id in teams_runs(d, messages, TEAMS_INTAKE_TIMEOUT_S).values():
        state.run_ids.append(run_id)
        state.via[run_id] = "teams"
    hooks = sum(1 for v in state.via.values() if v == "webhook")
    out.print(
        f"Enqueued {runs_word(len(state.run_ids))}: {len(state.run_ids) - len(state.via)} via "
        f"the client API, {_plural(len(messages), 'Teams message')} and "
        f"{_plural(hooks, 'webhook call')} via the app front."
    )


def _plural(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def _execute(state: DemoState, opts: DemoOptions, out: Console) -> Figures:
    """Start everything, enqueue, kill w1 mid-run, wait for the end and read the verdict."""
    settings = _start(state, opts, out)
    assert state.cluster is not None
    w1 = state.cluster.procs["w1"]
    with Deployment(settings, parse_keys(state.seal_keys)) as d:
        _enqueue(d, state, opts, out)
        state.cluster.pids.update(w1.children())
        state.kill = kill_when_busy(d, "w1", w1, state.run_ids, IN_FLIGHT_TIMEOUT_S)
        short = ", ".join(r[:8] for r in state.kill.in_flight)
        out.print(
            f"[bold red]SIGKILLed worker w1[/] (its whole process group) with "
            f"{runs_word(len(state.kill.in_flight))} in flight: {short}"
        )
        ttl = settings.timings.lease_ttl_ms / 1000
        out.print(
            "The death watch sees its connections close and claims each run once (the "
            f"sweeper would, once its leases lapse within {ttl:g} s); w2 resumes it."
        )
        wait_until_done(d, state.run_ids, opts.timeout_s, out)
        state.flower_checked = flower_guarded(state.flower_url, FLOWER_USER, state.flower_password)
        if not state.flower_checked:
            out.print("[bold red]Flower did not refuse a request without its password[/]")
        in_flight = set(state.kill.in_flight)
        figures = collect(d.engine, d.engine, state.run_ids, in_flight, state.kill.at, state.via)
        with d.engine.connect() as conn:
            state.timelines = select_timelines(conn, state.run_ids)
        return figures


def _context(state: DemoState, opts: DemoOptions) -> list[str]:
    """The set-up lines the HTML report lists under its figures."""
    notes = list(state.backends.notes)
    notes.append(
        f"Runs: {opts.runs}; workers w1 and w2 (prefork, 3 processes each); beat; the app "
        "front; Flower"
    )
    notes.append(f"Agent catalog (Teams and webhook agents): {state.log_dir / 'demo-agents.json'}")
    notes.append(f"Logs: {state.log_dir}")
    return notes


def inspect_hint(state: DemoState, f: Figures, out: Console) -> None:
    """Tell the user how to inspect the resumed run that had the most to settle."""
    rank = {"resent": 0, "read_back": 0, "sent_after_read_back": 0, "unknown": 0, "reused": 1}
    lines = sorted(
        (line for line in f.lines if line.lost_count > 0),
        key=lambda line: min((rank.get(s, 2) for s in line.resume), default=3),
    )
    resumed = [line.id for line in lines]
    if state.backends.private_postgres:
        out.print("The private Postgres and Redis were stopped and removed, with the runs.")
        return
    if not resumed:
        return
    exe = Path(sys.executable).parent / "liyagent"
    cmd = "liyagent"
    if exe.exists():
        cmd = os.path.relpath(exe) if exe.is_relative_to(Path.cwd()) else str(exe)
    out.print("See how a resumed run was taken up (checkpoints, call marks, audit):")
    # The seal key and the database's URL come from the secrets file, never the terminal.
    secrets_file = shlex.quote(str(state.secrets_file))
    out.print(
        f"  (set -a; . {secrets_file}; {cmd} inspect {resumed[0]})",
        soft_wrap=True,
        highlight=False,
    )


def _finish(state: DemoState, opts: DemoOptions, f: Figures, out: Console) -> dict[str, Any]:
    """Write the HTML report, print the verdict and return the JSON result."""
    stamp = datetime.now(UTC).strftime("%Y%m%d-%H%M%S")
    path = opts.report_dir / f"demo-{stamp}.html"
    report = write_html(path, f, state.kill, _context(state, opts), state.timelines)
    out.print(summary_table(f, state.kill))
    out.print(runs_table(f))
    out.print(f"Report: {report}")
    verdict = "[bold green]PASS[/]" if f.ok else "[bold red]FAIL[/]"
    out.print(
        f"{verdict}: {f.lost} lost, {f.count('failed')} failed, "
        f"{f.duplicate_writes} duplicate writes in the vendor's records"
        + (
            f"; {f.teams_replied_once} of {len(f.teams_replies)} Teams turns replied to once"
            if f.teams_replies
            else ""
        )
    )
    assert state.cluster is not None and state.kill is not None
    return {
        **f.to_json(),
        "report": str(report.resolve()),
        "killed_worker": state.kill.worker,
        "killed_at": state.kill.at.isoformat(),
        "in_flight_at_kill": state.kill.in_flight,
        "pids": sorted(state.cluster.pids),
        "log_dir": str(state.log_dir),
        "namespace": state.backends.namespace,
        "database_url": safe_url(state.backends.database_url),
        "database_kept": not state.backends.private_postgres,
        "front_url": state.front_url,
        "flower_url": state.flower_url,
        "flower_user": FLOWER_USER,
        "flower_checked": state.flower_checked,
        "secrets_file": str(state.secrets_file),
    }


def run_demo(opts: DemoOptions) -> int:
    """Run the demo; returns the exit code (0 all resumed, no duplicates; 1 otherwise)."""
    out = Console(stderr=opts.json, highlight=False)
    log_dir = Path(tempfile.mkdtemp(prefix="liyagent-demo-"))
    namespace = f"demo:{uuid.uuid4().hex[:12]}:"
    state = DemoState(log_dir=log_dir, backends=Backends(namespace=namespace))
    fh = _log_to(log_dir / "demo.log")
    out.print(f"[bold]liyagent demo[/]: {opts.runs} runs, two workers, w1 is SIGKILLed mid-run")
    out.print(f"  Logs of every process: {log_dir}")
    result: dict[str, Any] = {"error": "interrupted", "log_dir": str(log_dir)}
    figures, code = None, 130
    try:
        with sigterm_as_interrupt():
            figures = _execute(state, opts, out)
            result = _finish(state, opts, figures, out)
            code = 0 if figures.ok else 1
    except DemoError as exc:
        out.print(f"[bold red]error:[/] {exc}", highlight=False)
        result, code = {"error": str(exc), "log_dir": str(log_dir)}, exc.exit_code
    except (sa.exc.OperationalError, redis.exceptions.ConnectionError) as exc:
        why = str(getattr(exc, "orig", None) or exc).strip().splitlines()[0]
        out.print(f"[bold red]error:[/] lost Postgres or Redis during the demo: {why}")
        result, code = {"error": why, "log_dir": str(log_dir)}, 3
    except KeyboardInterrupt:
        out.print("Interrupted: stopping everything the demo started.")
    finally:
        _cleanup(state, out)
        fh.close()
    if figures is not None:
        inspect_hint(state, figures, out)
    if opts.json:
        print(json.dumps(result, default=str), flush=True)
    return code


def _cleanup(state: DemoState, out: Console) -> None:
    """Stop the processes and any private server and delete the demo's Redis keys."""
    if state.cluster is not None:
        state.cluster.stop()
    state.channel.stop()
    close_backends(state.backends)
    started = len(state.cluster.procs) if state.cluster else 0
    if started:
        out.print(f"Stopped the {started} processes the demo started; deleted its Redis keys.")
    log.info("demo.stopped", pids=sorted(state.cluster.pids) if state.cluster else [])
