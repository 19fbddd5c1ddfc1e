"""Settings from `LIYAGENT_*` environment variables, read once per process.

The lease and sweep timings are coupled, so they live together in `Timings`. The stores' URLs
are read by `store_urls.py`; its readers and `ConfigError` are named here too, as before.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from functools import lru_cache

from runtime.base.config import ConfigError as ConfigError
from runtime.base.store_urls import SENTINEL_SCHEME as SENTINEL_SCHEME
from runtime.base.store_urls import database_pooler as database_pooler
from runtime.base.store_urls import database_url as database_url
from runtime.base.store_urls import redis_master as redis_master
from runtime.base.store_urls import redis_url as redis_url
from runtime.base.store_urls import sentinel_url as sentinel_url
from runtime.base.tenancy import TenantLimits
from store.db import DEFAULT_DATABASE_URL, Pooler

DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"


def _env_int(name: str, default: int) -> int:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        return int(raw)
    except ValueError:
        raise ConfigError(f"{name}={raw!r} is not an integer") from None


def _env_step_max_bytes() -> int:
    value = _env_int("LIYAGENT_STEP_MAX_BYTES", 1 << 20)
    if value < 4096:
        raise ConfigError(
            f"LIYAGENT_STEP_MAX_BYTES={value}: a step needs at least 4096 bytes (default 1048576)"
        )
    return value


# A model's answer is read up to this many bytes (LIYAGENT_MODEL_RESPONSE_MAX_BYTES), at least
# the smallest it may be set to.
MODEL_RESPONSE_MAX_BYTES = 4 << 20
MODEL_RESPONSE_MIN_BYTES = 64 << 10


def _env_model_response_max_bytes() -> int:
    value = _env_int("LIYAGENT_MODEL_RESPONSE_MAX_BYTES", MODEL_RESPONSE_MAX_BYTES)
    if value < MODEL_RESPONSE_MIN_BYTES:
        raise ConfigError(
            f"LIYAGENT_MODEL_RESPONSE_MAX_BYTES={value}: a model's answer needs at least "
            f"{MODEL_RESPONSE_MIN_BYTES} bytes (default {MODEL_RESPONSE_MAX_BYTES})"
        )
    return value


def _env_source_roots() -> tuple[str, ...]:
    """LIYAGENT_SOURCE_ROOTS: absolute directories, comma-separated; a relative one is refused
    (it would depend on each worker's working directory)."""
    roots = _env_list("LIYAGENT_SOURCE_ROOTS")
    for root in roots:
        if not os.path.isabs(root):
            raise ConfigError(
                f"LIYAGENT_SOURCE_ROOTS: {root!r} is not an absolute path; name each directory "
                "source_sync may read from the root (/srv/docs,/data/notes)"
            )
    return roots


def env_nonnegative(name: str, default: int) -> int:
    value = _env_int(name, default)
    if value < 0:
        raise ConfigError(f"{name}={value} must be 0 or more")
    return value


def env_bool(name: str, default: bool) -> bool:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    value = raw.strip().lower()
    if value in {"1", "true", "yes", "on"}:
        return True
    if value in {"0", "false", "no", "off"}:
        return False
    raise ConfigError(f"{name}={raw!r} is not a boolean (use true or false)")


def _env_list(name: str) -> tuple[str, ...]:
    raw = os.environ.get(name, "")
    return tuple(filter(None, (p.strip() for p in raw.split(","))))


def _env_pairs(name: str) -> dict[str, str]:
    raw = os.environ.get(name, "").strip()
    pairs: dict[str, str] = {}
    for item in filter(None, (p.strip() for p in raw.split(","))):
        key, sep, value = item.partition("=")
        if not sep or not key or not value:
            raise ConfigError(f"{name}: each entry is name=value, got {item!r}")
        pairs[key.strip()] = value.strip()
    return pairs


@dataclass(frozen=True)
class Timings:
    """Lease, heartbeat and sweep timings, which only work together.

    A dead process is noticed when its lease lapses (`lease_ttl_ms`), so the heartbeat renews
    at about a third of it (two renewals may fail before the lease is lost) and the sweeper
    looks every `sweep_interval_ms`: worst-case detection is TTL + one sweep. A run whose own
    thread shows no progress for `stall_ms` stops being renewed, so a hung run is taken over;
    it must exceed the slowest single model or tool call (`call_timeout_s`).
    """

    lease_ttl_ms: int = 8000
    heartbeat_ms: int = 2600
    sweep_interval_ms: int = 3000
    stall_ms: int = 120_000
    call_timeout_s: float = 30.0
    # A run lost more than this many times is failed with the reason.
    loss_limit: int = 2
    # Deliveries of one attempt's message before the run is failed as poison.
    delivery_limit: int = 10
    # Runs left queued this long are published again (Postgres is the outbox).
    requeue_after_ms: int = 30_000
    # Every this many sweeps, reconcile all running runs against Redis, not just the index.
    full_scan_every: int = 20
    # The longest a resume can take: a keyed write is sent again only if its vendor's dedupe
    # window is longer than this.
    resume_bound_s: int = 3600
    # A holder with no Redis connection left this long is dead: its runs are claimed at once
    # (a blip reconnects well within it). While a process has lost its connection, it writes
    # and sends for at most this long, so it has stopped before any such claim.
    death_grace_ms: int = 1000
    # How often the death watch looks (the leader: one CLIENT LIST when nobody died; each other
    # watcher: two round trips of constant cost, its bid for the lead and CLIENT LIST ID).
    death_poll_ms: int = 250
    # Gates a statement read (the claim, a checkpoint) stand for this long at a step boundary:
    # a fast step reads them once, with its checkpoint, not again before the next model step.
    # Calls always go through the gates their step's checkpoint read; 0 reads at every boundary.
    gates_fresh_ms: int = 250
    # After Redis comes back (restarted, failed over, or empty: a new store epoch), nothing is
    # claimed for this long: live holders re-establish presence and take their leases back
    # within it, and only runs whose holders never came back are claimed. It must exceed a
    # heartbeat; 0 means the heartbeat plus the death grace.
    store_grace_ms: int = 0
    # How long a run whose pin the code a worker runs does not serve waits for a worker that
    # does (a fleet mid-deploy runs both), retrying at growing intervals, before it fails with
    # the reason (runtime/core/drift.py).
    definition_wait_s: int = 900

    def __post_init__(self) -> None:
        if self.store_grace_ms == 0:
            object.__setattr__(self, "store_grace_ms", self.heartbeat_ms + self.death_grace_ms)
        if self.store_grace_ms <= self.heartbeat_ms:
            raise ConfigError(
                "LIYAGENT_STORE_GRACE_MS must exceed LIYAGENT_HEARTBEAT_MS (live holders take "
                f"their leases back within a heartbeat; got {self.store_grace_ms} and "
                f"{self.heartbeat_ms})"
            )
        if self.heartbeat_ms * 2 >= self.lease_ttl_ms:
            raise ConfigError(
                "LIYAGENT_HEARTBEAT_MS must be under half of LIYAGENT_LEASE_TTL_MS "
                f"(got {self.heartbeat_ms} and {self.lease_ttl_ms})"
            )
        if self.stall_ms <= self.call_timeout_s * 1000:
            raise ConfigError("LIYAGENT_STALL_MS must exceed LIYAGENT_CALL_TIMEOUT_S")
        if not 0 < self.death_grace_ms < self.lease_ttl_ms:
            raise ConfigError(
                "LIYAGENT_DEATH_GRACE_MS must be above 0 and under LIYAGENT_LEASE_TTL_MS (a dead "
                f"process is seen by its connections before its lease; got {self.death_grace_ms})"
            )

        if self.definition_wait_s < 0:
            raise ConfigError(
                f"LIYAGENT_DEFINITION_WAIT_S must be 0 or more (got {self.definition_wait_s})"
            )
        if self.gates_fresh_ms < 0:
            raise ConfigError(
                f"LIYAGENT_GATES_FRESH_MS must be 0 or more (got {self.gates_fresh_ms})"
            )

    @classmethod
    def from_env(cls) -> Timings:
        ttl = _env_int("LIYAGENT_LEASE_TTL_MS", cls.lease_ttl_ms)
        return cls(
            lease_ttl_ms=ttl,
            heartbeat_ms=_env_int("LIYAGENT_HEARTBEAT_MS", max(ttl // 3 - 66, 100)),
            sweep_interval_ms=_env_int("LIYAGENT_SWEEP_INTERVAL_MS", cls.sweep_interval_ms),
            stall_ms=_env_int("LIYAGENT_STALL_MS", cls.stall_ms),
            call_timeout_s=float(_env_int("LIYAGENT_CALL_TIMEOUT_S", int(cls.call_timeout_s))),
            loss_limit=_env_int("LIYAGENT_LOSS_LIMIT", cls.loss_limit),
            delivery_limit=_env_int("LIYAGENT_DELIVERY_LIMIT", cls.delivery_limit),
            requeue_after_ms=_env_int("LIYAGENT_REQUEUE_AFTER_MS", cls.requeue_after_ms),
            full_scan_every=_env_int("LIYAGENT_FULL_SCAN_EVERY", cls.full_scan_every),
            resume_bound_s=_env_int("LIYAGENT_RESUME_BOUND_S", cls.resume_bound_s),
            death_grace_ms=_env_int("LIYAGENT_DEATH_GRACE_MS", cls.death_grace_ms),
            death_poll_ms=_env_int("LIYAGENT_DEATH_POLL_MS", cls.death_poll_ms),
            gates_fresh_ms=_env_int("LIYAGENT_GATES_FRESH_MS", cls.gates_fresh_ms),
            store_grace_ms=_env_int("LIYAGENT_STORE_GRACE_MS", cls.store_grace_ms),
            definition_wait_s=_env_int("LIYAGENT_DEFINITION_WAIT_S", cls.definition_wait_s),
        )


@dataclass(frozen=True)
class Retention:
    """What a finished run keeps and for how long; beat deletes the rest in bounded batches.

    A finished run (succeeded or failed) and everything hanging on it (call marks, transcript,
    approvals, A2A task, cron record, Teams inbox row, stops) are deleted `keep_s` after it
    finished, never before its sealed answer's own retention ends, never while its parent runs,
    and never while a key a caller may send again (request key, A2A message id, Teams activity
    id, cron slot) still dedupes: such runs are kept at least `key_window_s`. Audit rows
    outlive their run: they go `audit_keep_s` after they were written, once the run is gone.
    """

    enabled: bool = True
    keep_s: int = 30 * 86400
    key_window_s: int = 7 * 86400
    audit_keep_s: int = 365 * 86400
    # Runs (or audit rows) one statement deletes, and batches one beat pass runs at most.
    batch: int = 500
    max_batches: int = 20
    interval_s: int = 300

    def __post_init__(self) -> None:
        for name, value in (
            ("LIYAGENT_RETENTION_S", self.keep_s),
            ("LIYAGENT_RETENTION_KEY_WINDOW_S", self.key_window_s),
            ("LIYAGENT_RETENTION_AUDIT_S", self.audit_keep_s),
            ("LIYAGENT_RETENTION_BATCH", self.batch),
            ("LIYAGENT_RETENTION_MAX_BATCHES", self.max_batches),
            ("LIYAGENT_RETENTION_INTERVAL_S", self.interval_s),
        ):
            if value <= 0:
                raise ConfigError(f"{name} must be above 0 (got {value})")

    @classmethod
    def from_env(cls) -> Retention:
        return cls(
            enabled=env_bool("LIYAGENT_RETENTION", cls.enabled),
            keep_s=_env_int("LIYAGENT_RETENTION_S", cls.keep_s),
            key_window_s=_env_int("LIYAGENT_RETENTION_KEY_WINDOW_S", cls.key_window_s),
            audit_keep_s=_env_int("LIYAGENT_RETENTION_AUDIT_S", cls.audit_keep_s),
            batch=_env_int("LIYAGENT_RETENTION_BATCH", cls.batch),
            max_batches=_env_int("LIYAGENT_RETENTION_MAX_BATCHES", cls.max_batches),
            interval_s=_env_int("LIYAGENT_RETENTION_INTERVAL_S", cls.interval_s),
        )


@dataclass(frozen=True)
class Settings:
    """Everything a worker, beat or app process needs to reach Postgres and Redis."""

    database_url: str = DEFAULT_DATABASE_URL
    # What stands between every process and Postgres (LIYAGENT_DATABASE_POOLER): `pgbouncer`,
    # and no connection asks anything of a server session (store/db.py `Pooler`); the bounds a
    # direct link sets at connect must then be the server's for the role (checked at start).
    database_pooler: Pooler = Pooler.NONE
    redis_url: str = DEFAULT_REDIS_URL
    # With a sentinel:// `redis_url`: the name of the master its Sentinels watch (every Redis
    # client, the broker's included, follows that master through failovers).
    redis_master: str = ""
    # Prefix for every Redis key we and the broker write, so deployments and test runs that
    # share one Redis never see each other's leases or messages.
    namespace: str = ""
    queue: str = "liyagent"
    production: bool = False
    vendor_url: str = "http://127.0.0.1:8765"
    step_limit: int = 25
    # The most new content one step may add to its run's checkpoints (LIYAGENT_STEP_MAX_BYTES,
    # 1 MiB): the model's answer with its calls, plus its calls' results. A result that does not
    # fit is replaced by a refusal the model reads; an answer or an input that does not fit is
    # refused (the run fails, the enqueue is a BadRequest). Nothing is written half.
    step_max_bytes: int = 1 << 20
    # The most of a model's answer a worker reads (LIYAGENT_MODEL_RESPONSE_MAX_BYTES, 4 MiB):
    # past it the read stops and the run fails with the size; nothing of the answer is used.
    model_response_max_bytes: int = MODEL_RESPONSE_MAX_BYTES
    # The directories a `source_sync` job's `dir:` source may be under (LIYAGENT_SOURCE_ROOTS,
    # comma-separated absolute paths), symlinks and `..` resolved; none: `dir:` is refused.
    source_roots: tuple[str, ...] = ()
    crash_resume_entries: bool = True
    # Whether this worker's main process sweeps (LIYAGENT_WORKER_SWEEPS, on by default; the
    # fleet sweeps once per interval whichever workers do). Off only for a worker that must
    # leave recovery to its death watch (the trials that prove the watch alone).
    worker_sweeps: bool = True
    # Resumed runs first (LIYAGENT_RESUMED_FIRST, on by default; runtime/flow/order.py): a
    # resumed run's message is served before new runs', and a lost run's claim asks one
    # running first attempt to yield its slot at its next step boundary. Off: one FIFO queue.
    resumed_first: bool = True
    # Stops heard at once (LIYAGENT_STOP_PUSH, on by default; runtime/fleet/drops.py): a
    # worker cuts a stopped attempt's request in flight as the Stop publishes its lease's drop.
    # Off (a Redis proxy that forbids SUBSCRIBE): at its heartbeat's next renewal only.
    stop_push: bool = True
    # Runs in flight per tenant and their weights (LIYAGENT_TENANT_IN_FLIGHT,
    # LIYAGENT_TENANT_WEIGHTS; runtime/flow/tenants.py): unset, tenants are not bounded.
    tenants: TenantLimits = field(default_factory=TenantLimits)
    # Modules whose tools and agents every process loads (LIYAGENT_TOOLS, comma-separated),
    # the way Celery's `include` names task modules.
    tool_modules: tuple[str, ...] = ()
    # Modules whose job kinds (`@job`) every process loads before LIYAGENT_TOOLS' own
    # (LIYAGENT_JOB_MODULES, comma-separated): the built-in kinds, named as a module path so the
    # engine never imports the package that declares them.
    job_modules: tuple[str, ...] = ("liyagent.jobs",)
    # Operators' reclassification of tools, `name=kind` (e.g. chat.reply=read). A call already
    # marked a write stays a write whatever its tool is classified as now (I7).
    tool_kinds: dict[str, str] = field(default_factory=dict)
    # MCP servers whose tools every process lists at start (LIYAGENT_MCP_SERVERS): the path of
    # a JSON file, or the JSON itself (see runtime/toolbox/mcp_tools.py). Empty: none.
    mcp_servers: str = ""
    # The model endpoints runs may use and where each one's key is (LIYAGENT_MODEL_PROFILES:
    # JSON, or @path of a JSON file; runtime/models/profiles.py). Empty: the built-in ones.
    model_profiles: str = ""
    # What each model's tokens cost (LIYAGENT_MODEL_PRICES: JSON, or @path of a JSON file;
    # runtime/models/prices.py). Empty: the built-in prices.
    model_prices: str = ""
    # The usage ledger's own writes (LIYAGENT_USAGE_LEDGER, runtime/core/ledger.py): a step's
    # cost, and the Redis note a lost request's unconfirmed usage is recorded from. Off: tokens
    # are still written with their step (no statement of their own), nothing else.
    usage_ledger: bool = True
    # How long a delivered answer is kept, sealed, before the purge job clears it.
    answer_retention_s: int = 86400
    # Agent definitions and cron triggers (JSON); see agents/agents.json.
    agents_file: str = "agents/agents.json"
    # Bearer token of the app front (principal `front-token`, every right); with it, or
    # instead of it, tokens per principal (front/auth.py): a JSON file and the same JSON
    # inline. With none, the front refuses every request.
    front_token: str = ""
    front_tokens_file: str = ""
    front_tokens: str = ""
    # The front's parts a deployment demands (comma-separated names, front/parts.py): only
    # those are mounted and the front refuses to start without one's extra. Empty: every part
    # whose extra is installed, each other one skipped with a log line.
    front_parts: tuple[str, ...] = ()
    # The front's public base URL as A2A clients reach it (the agent card names its endpoint
    # there); empty: the URL each request for the card came in on.
    public_url: str = ""
    # How long an A2A SendMessage that did not ask to return at once waits for its task to end
    # or to need a person before answering with the task as it stands (clients then poll).
    a2a_wait_s: float = 30.0
    # How often an open event stream (SSE, A2A streaming) sends a heartbeat comment, so proxies
    # keep an idle stream open.
    sse_ping_s: float = 15.0
    # The most connections one process's pools may open to Postgres and to Redis; 0 follows
    # the worker's pool (runtime/base/pools.py: a `-P threads -c N` worker N plus its main
    # process's threads, any other process 15). A smaller database pool makes threads take
    # turns (each holds a connection for one statement); a Redis pool must cover every thread.
    db_pool_max: int = 0
    redis_pool_max: int = 0
    timings: Timings = field(default_factory=Timings)
    retention: Retention = field(default_factory=Retention)

    @classmethod
    def from_env(cls) -> Settings:
        env = os.environ.get("LIYAGENT_ENV", "development").strip().lower()
        if env not in {"development", "production", "test"}:
            raise ConfigError(f"LIYAGENT_ENV={env!r}: use development, production or test")
        redis = redis_url(os.environ.get("LIYAGENT_REDIS_URL") or DEFAULT_REDIS_URL)
        return cls(
            database_url=database_url(
                os.environ.get("LIYAGENT_DATABASE_URL") or DEFAULT_DATABASE_URL
            ),
            database_pooler=database_pooler(os.environ.get("LIYAGENT_DATABASE_POOLER", "")),
            redis_url=redis,
            redis_master=redis_master(redis, os.environ.get("LIYAGENT_REDIS_MASTER", "")),
            namespace=os.environ.get("LIYAGENT_NAMESPACE", ""),
            queue=os.environ.get("LIYAGENT_QUEUE") or "liyagent",
            production=env == "production",
            vendor_url=os.environ.get("LIYAGENT_VENDOR_URL") or "http://127.0.0.1:8765",
            step_limit=_env_int("LIYAGENT_STEP_LIMIT", 25),
            step_max_bytes=_env_step_max_bytes(),
            model_response_max_bytes=_env_model_response_max_bytes(),
            source_roots=_env_source_roots(),
            crash_resume_entries=env_bool("TICKETIQ_CRASH_RESUME_ENTRIES", True),
            worker_sweeps=env_bool("LIYAGENT_WORKER_SWEEPS", cls.worker_sweeps),
            resumed_first=env_bool("LIYAGENT_RESUMED_FIRST", cls.resumed_first),
            stop_push=env_bool("LIYAGENT_STOP_PUSH", cls.stop_push),
            tenants=TenantLimits.from_env(),
            tool_modules=_env_list("LIYAGENT_TOOLS"),
            job_modules=_env_list("LIYAGENT_JOB_MODULES")
            if "LIYAGENT_JOB_MODULES" in os.environ
            else cls.job_modules,
            tool_kinds=_env_pairs("LIYAGENT_TOOL_KINDS"),
            mcp_servers=os.environ.get("LIYAGENT_MCP_SERVERS", "").strip(),
            model_profiles=os.environ.get("LIYAGENT_MODEL_PROFILES", "").strip(),
            model_prices=os.environ.get("LIYAGENT_MODEL_PRICES", "").strip(),
            usage_ledger=env_bool("LIYAGENT_USAGE_LEDGER", cls.usage_ledger),
            answer_retention_s=_env_int("LIYAGENT_ANSWER_RETENTION_S", 86400),
            agents_file=os.environ.get("LIYAGENT_AGENTS_FILE") or "agents/agents.json",
            front_token=os.environ.get("LIYAGENT_FRONT_TOKEN", ""),
            front_tokens_file=os.environ.get("LIYAGENT_FRONT_TOKENS_FILE", ""),
            front_tokens=os.environ.get("LIYAGENT_FRONT_TOKENS", ""),
            front_parts=_env_list("LIYAGENT_FRONT_PARTS"),
            public_url=os.environ.get("LIYAGENT_PUBLIC_URL", "").rstrip("/"),
            a2a_wait_s=float(_env_int("LIYAGENT_A2A_WAIT_S", int(cls.a2a_wait_s))),
            sse_ping_s=float(_env_int("LIYAGENT_SSE_PING_S", int(cls.sse_ping_s))),
            db_pool_max=env_nonnegative("LIYAGENT_DB_POOL_MAX", 0),
            redis_pool_max=env_nonnegative("LIYAGENT_REDIS_POOL_MAX", 0),
            timings=Timings.from_env(),
            retention=Retention.from_env(),
        )


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    """The process's settings (tests that change the environment clear this cache)."""
    return Settings.from_env()
