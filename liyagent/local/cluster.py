"""A local deployment as real processes: the vendor simulator, prefork workers, beat, the app
front and Flower.

Each process runs in its own process group with its output in a log file, exactly as the tests
start them, so a SIGKILL of a worker's group is what a dead machine looks like.
"""

from __future__ import annotations

import os
import re
import time
from dataclasses import dataclass, field
from pathlib import Path

import structlog

from liyagent.local import sim_model
from liyagent.local.backends import DemoError
from liyagent.local.procs import Proc, python
from runtime.base.settings import Settings

log = structlog.get_logger(__name__)

START_TIMEOUT_S = 60.0
# A clean stop gets this long before its group is SIGKILLed.
STOP_GRACE_S = 5.0


def child_env(settings: Settings, seal_keys: str) -> dict[str, str]:
    """The environment of every child: this deployment's settings, and no stray LIYAGENT_*."""
    base = {k: v for k, v in os.environ.items() if not k.startswith(("LIYAGENT_", "TICKETIQ_"))}
    t = settings.timings
    return {
        **base,
        "LIYAGENT_ENV": "development",
        "LIYAGENT_DATABASE_URL": settings.database_url,
        "LIYAGENT_DATABASE_POOLER": settings.database_pooler.value,
        "LIYAGENT_REDIS_URL": settings.redis_url,
        "LIYAGENT_REDIS_MASTER": settings.redis_master,
        "LIYAGENT_NAMESPACE": settings.namespace,
        "LIYAGENT_QUEUE": settings.queue,
        "LIYAGENT_SEAL_KEYS": seal_keys,
        "LIYAGENT_VENDOR_URL": settings.vendor_url,
        "LIYAGENT_TOOLS": ",".join(settings.tool_modules),
        sim_model.KEY_ENV: sim_model.KEY,
        "LIYAGENT_MODEL_PROFILES": settings.model_profiles,
        "LIYAGENT_LOG_FORMAT": "json",
        "LIYAGENT_LEASE_TTL_MS": str(t.lease_ttl_ms),
        "LIYAGENT_HEARTBEAT_MS": str(t.heartbeat_ms),
        "LIYAGENT_SWEEP_INTERVAL_MS": str(t.sweep_interval_ms),
        "LIYAGENT_REQUEUE_AFTER_MS": str(t.requeue_after_ms),
        "LIYAGENT_LOSS_LIMIT": str(t.loss_limit),
        "LIYAGENT_FULL_SCAN_EVERY": str(t.full_scan_every),
        "LIYAGENT_AGENTS_FILE": settings.agents_file,
        "LIYAGENT_FRONT_TOKEN": settings.front_token,
        "LIYAGENT_ANSWER_RETENTION_S": str(settings.answer_retention_s),
        "TICKETIQ_CRASH_RESUME_ENTRIES": "true" if settings.crash_resume_entries else "false",
        "LIYAGENT_RESUMED_FIRST": "true" if settings.resumed_first else "false",
        "LIYAGENT_STOP_PUSH": "true" if settings.stop_push else "false",
        "LIYAGENT_MODEL_PRICES": settings.model_prices,
        "LIYAGENT_USAGE_LEDGER": "true" if settings.usage_ledger else "false",
        **settings.tenants.env(),
    }


# The Celery app every process here is started with: liyagent's, under a name no team's module
# takes (liyagent/worker.py; `celery -A tasks` loads the same app).
APP = "liyagent.worker"

# Flower's line once it listens; group 1 is its base URL.
FLOWER_READY = r"Visit me at (http://\S+)"


def flower_command(
    env: dict[str, str], user: str, password: str
) -> tuple[list[str], dict[str, str]]:
    """Flower's command and environment: a free loopback port, HTTP basic auth whose
    credentials go in its environment (FLOWER_BASIC_AUTH), not on its command line."""
    argv = python("-m", "celery", "-A", APP, "flower", "--port=0", "--address=127.0.0.1")
    env = {k: v for k, v in env.items() if not k.startswith("FLOWER_")}
    env["FLOWER_BASIC_AUTH"] = f"{user}:{password}"
    return argv, env


# The Celery pools the trials run under: a process per run slot, or threads in one process.
POOLS = ("prefork", "threads")


def worker_argv(
    name: str, queues: str, concurrency: int, app: str = APP, pool: str = "prefork"
) -> list[str]:
    """The command of one real worker on `queues` (comma-separated), as tests, the demo and
    the trials start it: no gossip or mingle chatter between workers. Its event heartbeats
    stay on: they keep it listed in Flower, which turns task events on through them. `app` is
    the Celery app module (the bench also starts a plain-Celery baseline's); `pool` is
    Celery's `-P` (prefork: a process per slot; threads: every slot a thread of one process)."""
    return python(
        "-m",
        "celery",
        "-A",
        app,
        "worker",
        "-Q",
        queues,
        "-c",
        str(concurrency),
        "-n",
        f"{name}@%h",
        "-P",
        pool,
        "--without-gossip",
        "--without-mingle",
        "-l",
        "INFO",
    )


@dataclass
class Cluster:
    """The processes of one local deployment, stopped together by `stop`."""

    log_dir: Path
    procs: dict[str, Proc] = field(default_factory=dict)
    # Every pid started (group leaders and the pool children seen), for the caller to check.
    pids: set[int] = field(default_factory=set)

    def _start(
        self, name: str, argv: list[str], env: dict[str, str], ready: str
    ) -> tuple[Proc, re.Match[str]]:
        """Start one process and wait for its readiness line; fail with its log if none comes."""
        proc = Proc(name, argv, env, self.log_dir / f"{name}.log")
        self.procs[name] = proc
        self.pids.add(proc.popen.pid)
        try:
            found = proc.wait_for(ready, timeout=START_TIMEOUT_S)
        except AssertionError as exc:
            raise DemoError(f"{name} did not start (its log: {proc.log}): {exc}") from None
        log.info("cluster.started", name=name, pid=proc.popen.pid, log=str(proc.log))
        return proc, found

    def simulator(self, database_url: str, env: dict[str, str], name: str = "simulator") -> str:
        """Start the vendor simulator recording into `database_url`; returns its base URL."""
        argv = python("-m", "simulators", "--port", "0", "--database-url", database_url)
        _, found = self._start(name, argv, env, r"simulators listening on (http://\S+)")
        return found.group(1)

    def worker(
        self,
        name: str,
        queue: str,
        env: dict[str, str],
        concurrency: int = 3,
        ops: bool = True,
        app: str = APP,
        pool: str = "prefork",
    ) -> Proc:
        """A real `celery -A liyagent.worker worker` (`-P pool`) on the run queue (and its ops
        queue); `app` names another Celery app module (the bench's plain-Celery baseline)."""
        queues = f"{queue},{queue}.ops" if ops else queue
        argv = worker_argv(name, queues, concurrency, app, pool)
        proc, _ = self._start(name, argv, env, r"ready\.")
        self.pids.update(proc.children())
        return proc

    def front(self, env: dict[str, str]) -> str:
        """The app's HTTP front; returns its base URL."""
        argv = python("-m", "front", "--port", "0")
        _, found = self._start("front", argv, env, r"front listening on (http://\S+)")
        return found.group(1)

    def flower(self, env: dict[str, str], user: str, password: str) -> str:
        """Flower on a free loopback port, behind HTTP basic auth; returns its base URL."""
        argv, env = flower_command(env, user, password)
        _, found = self._start("flower", argv, env, FLOWER_READY)
        return found.group(1).rstrip("/")

    def beat(self, env: dict[str, str]) -> Proc:
        """Celery beat, which fires the lease sweeper."""
        argv = python("-m", "celery", "-A", APP, "beat", "-l", "INFO")
        return self._start("beat", argv, env, r"beat: Starting")[0]

    def stop(self) -> None:
        """Stop every process cleanly (SIGTERM to every group at once, so their shutdowns
        overlap instead of queueing), killing what has not stopped within the grace."""
        procs = list(reversed(list(self.procs.items())))
        for _, proc in procs:
            proc.ask_to_stop()
        deadline = time.monotonic() + STOP_GRACE_S
        for name, proc in procs:
            proc.stopped_by(deadline)
            log.info("cluster.stopped", name=name, exit=proc.popen.returncode)
