"""The two sides the bench compares, behind one interface: start one run of an agent, and read
which runs have ended and when (by the database's clock, the wall clock of this machine).

- `LiyagentSide`: runs started through the client API (one statement inserts the run and its
  first checkpoint, then its message is published), run by real liyagent workers; a run has
  ended when its row is `succeeded` or `failed`, at its `finished_at`.
- `BaselineSide`: the plain-Celery baseline's task sent with the same arguments; a job has ended
  when its answer row exists, at its `finished_at`.

The model spec (a script registered with the simulators' model) is made once per script.
"""

from __future__ import annotations

import json
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Protocol

import sqlalchemy as sa
from celery import Celery

import celeryconfig
from bench import agents, baseline
from liyagent.local import sim_model
from runtime import services as runtime_services
from runtime.base.sealing import parse_keys
from runtime.base.settings import Settings
from runtime.entries.client import Client
from tasks.services import CeleryPublisher

POLL_S = 0.05
SEQUENTIAL_POLL_S = 0.003
# Above this many runs still outstanding, a wait polls every MANY_POLL_S: end times are read
# from the store's records (`finished_at`), so the poll's pace moves no figure, and a fast poll
# over hundreds of ids is Postgres work charged to the side being measured.
FEW_OUTSTANDING = 50
MANY_POLL_S = 0.5


class BenchError(RuntimeError):
    """A measurement could not be made (runs did not end, failed, ...); says which and why."""


class Side(Protocol):
    name: str

    def start(self, steps: agents.Steps) -> str: ...

    def ended(self, ids: list[str]) -> dict[str, float]: ...

    def failed(self, ids: list[str]) -> list[str]: ...

    def close(self) -> None: ...


@dataclass
class _Models:
    sim_url: str
    cache: dict[str, dict[str, Any]] = field(default_factory=dict)

    def spec(self, steps: agents.Steps) -> dict[str, Any]:
        key = json.dumps(steps, sort_keys=True)
        if key not in self.cache:
            self.cache[key] = sim_model.register(self.sim_url, steps)
        return self.cache[key]


class LiyagentSide:
    """Runs started through liyagent's client API."""

    name = "liyagent"

    def __init__(self, settings: Settings, seal_keys: str) -> None:
        self.settings = settings
        self.app = Celery("liyagent-bench", set_as_current=False)
        self.app.conf.update(celeryconfig.config_for(settings))
        self.services = runtime_services.build(
            settings,
            CeleryPublisher(self.app, settings.queue, settings.resumed_first),
            sealer=parse_keys(seal_keys),
        )
        self.client = Client(self.services)
        self.models = _Models(settings.vendor_url)

    def start(self, steps: agents.Steps) -> str:
        return str(
            self.client.start_run(
                agent="bench-agent",
                model=self.models.spec(steps),
                user_input=agents.USER_INPUT,
                tools=agents.TOOLS,
            )
        )

    def ended(self, ids: list[str]) -> dict[str, float]:
        """Ended runs (succeeded or failed) and when, in epoch seconds."""
        rows = _by_ids(
            self.services.engine,
            "SELECT CAST(id AS text) AS id, EXTRACT(EPOCH FROM finished_at) AS ended FROM runs "
            "WHERE id = ANY(CAST(:ids AS uuid[])) AND status IN ('succeeded', 'failed') "
            "AND finished_at IS NOT NULL",
            ids,
        )
        return {r.id: float(r.ended) for r in rows}

    def failed(self, ids: list[str]) -> list[str]:
        sql = "SELECT CAST(id AS text) AS id FROM runs WHERE id = ANY(CAST(:ids AS uuid[])) "
        return [r.id for r in _by_ids(self.services.engine, sql + "AND status <> 'succeeded'", ids)]

    def close(self) -> None:
        self.services.redis.close()
        self.services.engine.dispose()


class BaselineSide:
    """Jobs of the plain-Celery baseline."""

    name = "plain Celery"

    def __init__(
        self, sim_url: str, database_url: str, redis_url: str, namespace: str, queue: str
    ) -> None:
        self.app = baseline.make_app(redis_url, namespace, queue)
        self.queue = queue
        self.engine = sa.create_engine(
            database_url, isolation_level="AUTOCOMMIT", hide_parameters=True
        )
        self.models = _Models(sim_url)

    def start(self, steps: agents.Steps) -> str:
        job_id = str(uuid.uuid4())
        spec = self.models.spec(steps)
        model = {"model": spec["model"]}
        self.app.send_task(
            baseline.TASK, args=[job_id, model, agents.TOOLS, agents.USER_INPUT], queue=self.queue
        )
        return job_id

    def ended(self, ids: list[str]) -> dict[str, float]:
        rows = _by_ids(
            self.engine,
            "SELECT CAST(job_id AS text) AS id, EXTRACT(EPOCH FROM finished_at) AS ended "
            "FROM answers WHERE job_id = ANY(CAST(:ids AS uuid[]))",
            ids,
        )
        return {r.id: float(r.ended) for r in rows}

    def failed(self, ids: list[str]) -> list[str]:
        return []  # a failed job writes no answer: it never ends, and the wait says so

    def close(self) -> None:
        self.engine.dispose()
        self.app.close()


def _by_ids(engine: sa.Engine, sql: str, ids: list[str]) -> list[Any]:
    """The rows of a query over these run (or job) ids."""
    with engine.connect() as conn:
        return list(conn.execute(sa.text(sql), {"ids": ids}).all())


def create_answers_table(database_url: str) -> None:
    engine = sa.create_engine(database_url, isolation_level="AUTOCOMMIT", hide_parameters=True)
    try:
        with engine.connect() as conn:
            conn.execute(sa.text(baseline.ANSWERS_DDL))
    finally:
        engine.dispose()


def wait_ended(
    side: Side, ids: list[str], timeout_s: float, poll_s: float = POLL_S
) -> dict[str, float]:
    """Wait (bounded) until every run has ended; their end times (as recorded), asking only for
    the runs still outstanding. Raises BenchError naming how many did not end, or which failed."""
    deadline = time.monotonic() + timeout_s
    ends: dict[str, float] = {}
    while True:
        left = [i for i in ids if i not in ends]
        ends.update(side.ended(left))
        if len(ends) == len(ids):
            break
        if time.monotonic() > deadline:
            raise BenchError(
                f"{side.name}: {len(ids) - len(ends)} of {len(ids)} runs did not end within "
                f"{timeout_s:g} s (see the worker logs)"
            )
        time.sleep(poll_s if len(left) <= FEW_OUTSTANDING else max(poll_s, MANY_POLL_S))
    failed = side.failed(ids)
    if failed:
        raise BenchError(f"{side.name}: {len(failed)} of {len(ids)} runs failed, e.g. {failed[0]}")
    return ends


@dataclass(frozen=True)
class Burst:
    """N runs started at once: when the first was started, when each ended."""

    runs: int
    started_at: float
    ends: list[float]

    @property
    def seconds(self) -> float:
        return max(self.ends) - self.started_at

    @property
    def runs_per_s(self) -> float:
        return self.runs / self.seconds


def burst(side: Side, steps: agents.Steps, runs: int, timeout_s: float) -> Burst:
    """Start `runs` runs as fast as possible and wait until all have ended."""
    started = time.time()
    ids = [side.start(steps) for _ in range(runs)]
    ends = wait_ended(side, ids, timeout_s)
    return Burst(runs, started, list(ends.values()))


STARTERS = 4  # bench threads starting runs at once


def start_many(side: LiyagentSide, steps: agents.Steps, n: int) -> list[str]:
    """Start `n` runs of `steps` from STARTERS threads at once; their ids."""
    side.models.spec(steps)  # registered once, before the threads share the cache
    with ThreadPoolExecutor(STARTERS) as pool:
        return list(pool.map(lambda _: side.start(steps), range(n)))


def sequential(side: Side, steps: agents.Steps, runs: int, timeout_s: float) -> list[float]:
    """Latency of runs started one at a time (each after the last ended): seconds from just
    before the start to its end, by the database's clock."""
    out: list[float] = []
    for _ in range(runs):
        started = time.time()
        run_id = side.start(steps)
        ends = wait_ended(side, [run_id], timeout_s, SEQUENTIAL_POLL_S)
        out.append(ends[run_id] - started)
    return out
