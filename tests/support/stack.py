"""A per-test deployment: its own database and Redis namespace, real worker and beat
processes, and the vendor simulator, judged from Postgres."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import httpx
import sqlalchemy as sa
from celery import Celery

import celeryconfig
from liyagent.local import sim_model as sim_model_module
from liyagent.local.cluster import POOLS, worker_argv
from liyagent.local.procs import Proc, python
from runtime import services as runtime_services
from runtime.base.sealing import Sealer
from runtime.base.settings import Settings, Timings
from runtime.durable.definition import RunDefinition
from runtime.entries.client import Client, RunView
from runtime.services import Services
from store.rows import QueuedAttempt
from store.runs import get_run
from tasks.services import CeleryPublisher

SIM_MODEL_KEY_ENV, SIM_MODEL_KEY, TOOLS = (
    sim_model_module.KEY_ENV,
    sim_model_module.KEY,
    sim_model_module.TOOLS,
)
sim_model = sim_model_module.register


# Short, still coupled, timings so crash tests take seconds (the kill trials use the real ones).
FAST = Timings(
    lease_ttl_ms=3000,
    heartbeat_ms=900,
    sweep_interval_ms=1000,
    requeue_after_ms=6000,
    full_scan_every=5,
)


# The Celery pool of every worker a test starts without naming one: the fault trials run under
# prefork, or all of them under threads with LIYAGENT_TRIALS_POOL=threads.
POOL = os.environ.get("LIYAGENT_TRIALS_POOL") or "prefork"
if POOL not in POOLS:
    raise ValueError(f"LIYAGENT_TRIALS_POOL={POOL!r}: use one of {', '.join(POOLS)}")


def timings_env(t: Timings) -> dict[str, str]:
    return {
        "LIYAGENT_LEASE_TTL_MS": str(t.lease_ttl_ms),
        "LIYAGENT_HEARTBEAT_MS": str(t.heartbeat_ms),
        "LIYAGENT_SWEEP_INTERVAL_MS": str(t.sweep_interval_ms),
        "LIYAGENT_REQUEUE_AFTER_MS": str(t.requeue_after_ms),
        "LIYAGENT_FULL_SCAN_EVERY": str(t.full_scan_every),
        "LIYAGENT_LOSS_LIMIT": str(t.loss_limit),
    }


def script_tools(steps: list[dict[str, Any]]) -> list[str]:
    """The tools a script's steps call, in order of first call."""
    names = [c["tool"] for s in steps for c in s.get("calls") or []]
    return list(dict.fromkeys(names))


@dataclass
class Stack:
    settings: Settings
    sealer: Sealer
    seal_keys: str
    tmp: Path
    sim_url: str
    sim_engine: sa.Engine
    procs: list[Proc] = field(default_factory=list)
    # More environment for every process started after it is set (a Teams bot's credentials).
    extra_env: dict[str, str] = field(default_factory=dict)
    # Variables removed from the environment of every process started after it is set (to
    # prove a setting's default with the variable unset).
    unset_env: set[str] = field(default_factory=set)

    def __post_init__(self) -> None:
        self.app = Celery("liyagent-test", set_as_current=False)
        self.app.conf.update(celeryconfig.config_for(self.settings))
        self.services: Services = runtime_services.build(
            self.settings,
            CeleryPublisher(self.app, self.settings.queue, self.settings.resumed_first),
            sealer=self.sealer,
        )
        self.client = Client(self.services)
        self.engine = self.services.engine

    @property
    def env(self) -> dict[str, str]:
        s = self.settings
        env = {
            **os.environ,
            "LIYAGENT_ENV": "test",
            "LIYAGENT_DATABASE_URL": s.database_url,
            "LIYAGENT_DATABASE_POOLER": s.database_pooler.value,
            "LIYAGENT_REDIS_URL": s.redis_url,
            "LIYAGENT_REDIS_MASTER": s.redis_master,
            "LIYAGENT_NAMESPACE": s.namespace,
            "LIYAGENT_QUEUE": s.queue,
            "LIYAGENT_SEAL_KEYS": self.seal_keys,
            "LIYAGENT_VENDOR_URL": self.sim_url,
            "LIYAGENT_TOOLS": ",".join(s.tool_modules),
            "LIYAGENT_MCP_SERVERS": s.mcp_servers,
            SIM_MODEL_KEY_ENV: SIM_MODEL_KEY,
            "LIYAGENT_MODEL_PROFILES": s.model_profiles,
            "LIYAGENT_LOG_FORMAT": "json",
            "LIYAGENT_AGENTS_FILE": s.agents_file,
            "LIYAGENT_ANSWER_RETENTION_S": str(s.answer_retention_s),
            "LIYAGENT_SOURCE_ROOTS": ",".join(s.source_roots),
            "TICKETIQ_CRASH_RESUME_ENTRIES": "true" if s.crash_resume_entries else "false",
            **timings_env(s.timings),
            **s.tenants.env(),
            **self.extra_env,
        }
        return {k: v for k, v in env.items() if k not in self.unset_env}

    def declare_model(self, name: str, provider: str, base_url: str, key_env: str) -> None:
        """Declare one more model profile (the simulators' stays) for this process and every
        process started after: the endpoint runs may then name."""
        declared = json.loads(self.settings.model_profiles or "{}")
        declared[name] = {"provider": provider, "base_url": base_url, "api_key_env": key_env}
        self.reconfigure(model_profiles=json.dumps(declared))

    def reconfigure(self, **changes: Any) -> None:
        """Change settings for this process's services and every process started after."""
        self.services.redis.close()
        self.settings = replace(self.settings, **changes)
        self.__post_init__()

    def worker(
        self,
        name: str = "w1",
        *,
        fault: str | None = None,
        concurrency: int = 2,
        env: dict[str, str] | None = None,
        ops: bool = True,
        runs: bool = True,
        pool: str | None = None,
        sweeps: bool = True,
        wrap: Callable[[list[str]], list[str]] | None = None,
        queue: str | None = None,
    ) -> Proc:
        """A real `celery -A tasks worker` under `pool` (default `POOL`), ready to take
        messages; `sweeps=False`: its main process does not sweep (only its death watch
        recovers runs); `wrap`: the command it runs under (`ip netns exec ...`); `queue`: the
        runs' queue it consumes (default the deployment's)."""
        q = queue or self.settings.queue
        extra = dict(env or {})
        if not sweeps:
            extra["LIYAGENT_WORKER_SWEEPS"] = "false"
        if fault:
            extra["LIYAGENT_FAULT"] = fault
            extra["LIYAGENT_FAULT_FILE"] = str(self.tmp / f"{name}.fault")
        queues = ",".join([*([q] if runs else []), *([f"{q}.ops"] if ops else [])])
        argv = worker_argv(name, queues, concurrency, pool=pool or POOL)
        argv = wrap(argv) if wrap else argv
        proc = Proc(name, argv, {**self.env, **extra}, self.tmp / f"{name}.log")
        self.procs.append(proc)
        proc.wait_for(r"ready\.", timeout=60)
        return proc

    def beat(self, name: str = "beat") -> Proc:
        argv = python("-m", "celery", "-A", "tasks", "beat", "-l", "INFO")
        proc = Proc(name, argv, self.env, self.tmp / f"{name}.log")
        self.procs.append(proc)
        proc.wait_for(r"beat: Starting", timeout=60)
        return proc

    def kill_at(
        self,
        fault: str,
        start: Callable[[], str],
        pool: str | None = None,
        env: dict[str, str] | None = None,
    ) -> str:
        """Start a victim worker armed with `fault` (`env` added to its environment), start
        work with `start`, and return once the fault has SIGKILLed its whole process group."""
        victim = self.worker("victim", fault=fault, pool=pool, env=env)
        run_id = start()
        self.fault_hit("victim")
        victim.popen.wait(timeout=10)
        return run_id

    def kill_then_resume(
        self, fault: str, start: Callable[[], str], env: dict[str, str] | None = None
    ) -> str:
        """`kill_at`, then a survivor worker (with the same `env`) and beat to recover the
        lost work."""
        run_id = self.kill_at(fault, start, env=env)
        self.worker("survivor", env=env)
        self.beat()
        return run_id

    def posts_by_vendor(self, run_id: str) -> dict[str, int]:
        """Writes each vendor received for a run, by its own records."""
        rows = self.vendor(
            "SELECT vendor, count(*) AS n FROM sim.requests WHERE run_id = :r "
            "AND method = 'POST' AND vendor <> 'model' GROUP BY vendor",
            r=run_id,
        )
        return {r.vendor: r.n for r in rows}

    def model(self, steps: list[dict[str, Any]]) -> dict[str, Any]:
        """A model spec that plays `steps` from the simulators' scripted model (served over
        HTTP, OpenAI-compatible), so what it was asked is judged from its own records."""
        return sim_model(self.sim_url, steps)

    def fault(self, run_id: str, method: str, path: str, status: int, **options: Any) -> None:
        """Arm a vendor fault for one run's requests (`after=True`: the effect lands, the
        answer is lost)."""
        body = {"run_id": run_id, "method": method, "path": path, "status": status, **options}
        httpx.post(f"{self.sim_url}/sim/faults", json=body, timeout=10).raise_for_status()

    def asked(self, run_id: str) -> dict[int, int]:
        """How many times each model step of a run was asked, from the model server's records."""
        rows = self.vendor(
            "SELECT call AS step, count(*) AS n FROM sim.requests WHERE vendor = 'model' "
            "AND run_id = :r AND method = 'POST' AND status = 200 GROUP BY call",
            r=run_id,
        )
        return {int(r.step): r.n for r in rows}

    def told(self, run_id: str, step: int) -> list[dict[str, Any]]:
        """The tool results (outcomes) the model was given when asked for `step`, in call
        order, from the model server's record of its last such request."""
        return list(self.told_by_tool(run_id, step).values())

    def told_by_tool(self, run_id: str, step: int) -> dict[str, dict[str, Any]]:
        """The same, by tool name."""
        messages = self.model_request(run_id, step)["messages"]
        last = max(i for i, m in enumerate(messages) if m["role"] != "tool")
        names = {
            c["id"]: c["function"]["name"].replace("__", ".")
            for c in messages[last].get("tool_calls") or []
        }
        return {names[m["tool_call_id"]]: json.loads(m["content"]) for m in messages[last + 1 :]}

    def fault_hit(self, name: str, timeout: float = 30.0) -> str:
        """Wait until worker `name` reached its armed fault point."""
        path = self.tmp / f"{name}.fault"
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if path.exists() and path.read_text().strip():
                return path.read_text().strip()
            time.sleep(0.02)
        raise AssertionError(f"worker {name} never reached its fault point")

    def start(
        self,
        steps: list[dict[str, Any]],
        *,
        user_input: str = "help",
        request_key: str | None = None,
        tools: list[str] | None = None,
        definition_policy: str = "pinned",
    ) -> str:
        """Start a run of `steps`; it may use `tools`, by default exactly the tools its
        steps call (a run is offered only the tools it names); `definition_policy`: what it
        does when a worker's code no longer serves its pin (runtime/core/drift.py)."""
        return self.client.start_run(
            agent="support-bot",
            model=self.model(steps),
            user_input=user_input,
            request_key=request_key,
            tools=script_tools(steps) if tools is None else tools,
            definition_policy=definition_policy,
        )

    def offered(self, run_id: str, step: int) -> list[str]:
        """The tool names the model was offered when asked for `step`, from the model
        server's record of that request (wire names mapped back)."""
        body = self.model_request(run_id, step, answered=False)
        return [t["function"]["name"].replace("__", ".") for t in body.get("tools", [])]

    def model_request(self, run_id: str, step: int, *, answered: bool = True) -> dict[str, Any]:
        """The body of the last request the model was sent for `step` (`answered`: of those
        it answered with a 200), from the model server's records."""
        status = "AND status = 200 " if answered else ""
        rows = self.vendor(
            "SELECT body FROM sim.requests WHERE vendor = 'model' AND run_id = :r "
            f"AND call = :s {status}ORDER BY id DESC LIMIT 1",
            r=run_id,
            s=str(step),
        )
        assert rows, f"the model was never asked for step {step} of run {run_id}"
        return dict(rows[0].body)

    def redis_address(self) -> tuple[str, int]:
        """The host and port of the stack's Redis (for a proxy a test can cut in front of it)."""
        url = sa.make_url(self.settings.redis_url.replace("redis://", "postgresql://"))
        return url.host or "127.0.0.1", url.port or 6379

    def wait(self, run_id: str, timeout: float = 60.0) -> RunView:
        return self.client.wait(run_id, timeout_s=timeout)

    @contextmanager
    def db(self) -> Iterator[sa.Connection]:
        with self.engine.connect() as conn:
            yield conn

    def definition(self, run_id: str) -> RunDefinition:
        """A run's sealed definition, opened and verified as a worker opens it."""
        with self.engine.connect() as conn:
            return RunDefinition.open(self.sealer, get_run(conn, run_id))

    def rows(self, sql: str, **params: Any) -> list[sa.Row[Any]]:
        with self.engine.connect() as conn:
            return list(conn.execute(sa.text(sql), params).all())

    def vendor(self, sql: str, **params: Any) -> list[sa.Row[Any]]:
        """Rows from the vendor simulator's own records (the judge of duplicates)."""
        with self.sim_engine.connect() as conn:
            return list(conn.execute(sa.text(sql), params).all())

    def vendor_writes(self, run_id: str) -> list[sa.Row[Any]]:
        return self.vendor(
            "SELECT vendor, method, path, idem_key, attempt, status, deduped, created_at "
            "FROM sim.requests WHERE run_id = :r AND method = 'POST' AND vendor <> 'model' "
            "ORDER BY id",
            r=run_id,
        )

    def close(self) -> None:
        for proc in self.procs:
            proc.kill()
        self.services.heartbeat.stop()
        self.services.redis.close()
        self.engine.dispose()


class RecordingPublisher:
    """Records what would be published (and can refuse, as an unreachable broker does)."""

    def __init__(self, fail: bool = False) -> None:
        self.fail = fail
        self.sent: list[tuple[str, int]] = []
        self.batches: list[list[tuple[str, int]]] = []  # each publish_many call's messages
        self.priorities: dict[tuple[str, int], int] = {}  # the run priority each was sent at
        # Whether each was published again after a dead worker took it (publish_many only).
        self.redelivered: dict[tuple[str, int], bool] = {}

    def publish(self, run_id: str, attempt: int, priority: int = 2) -> None:
        if self.fail:
            raise ConnectionError("broker unreachable")
        self.sent.append((run_id, attempt))
        self.priorities[(run_id, attempt)] = priority

    def publish_many(self, runs: Sequence[QueuedAttempt]) -> None:
        self.batches.append([(run.run_id, run.attempt) for run in runs])
        for run in runs:
            self.publish(run.run_id, run.attempt, run.priority)
            self.redelivered[(run.run_id, run.attempt)] = run.redelivered


def services_with(stack: Stack, publisher: Any, timings: Timings | None = None) -> Services:
    """In-process services over the stack's database and namespace, with a given publisher."""
    settings = replace(stack.settings, timings=timings or stack.settings.timings)
    return runtime_services.build(settings, publisher, sealer=stack.sealer)
