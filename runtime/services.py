"""Everything a process needs, built once per process from settings: engine, Redis, leases,
heartbeat, sealer, tools and the publisher that puts run messages on the queue."""

from __future__ import annotations

import os
import socket
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import redis
import sqlalchemy as sa
from redis.backoff import NoBackoff
from redis.retry import Retry

from runtime.base import pools, process
from runtime.base.changes import RunChanges
from runtime.base.extras import need
from runtime.base.redis_clients import RedisTarget, client_for
from runtime.base.sealing import Sealer, load_sealer, say_dev_key_once
from runtime.base.settings import Settings
from runtime.base.tenancy import NORMAL
from runtime.base.tracing import OFF, Tracing, from_env
from runtime.fleet.drops import DropWatch
from runtime.fleet.drops import listener_name as drops_listener
from runtime.fleet.heartbeat import Heartbeat, Owners
from runtime.fleet.leases import Leases
from runtime.fleet.presence import Presence, close_sockets_here, connection_name
from runtime.fleet.reach import PostgresReach
from runtime.flow.closes import listener_name
from runtime.flow.gate import EndpointGates
from runtime.models import profiles, specs
from runtime.models.base import ModelError, ModelProvider
from runtime.models.profiles import ModelProfile
from runtime.models.scripted import ScriptedProvider
from runtime.toolbox.tool_sources import load_registry
from runtime.toolbox.tools import ToolRegistry
from store import db
from store.rows import QueuedAttempt
from store.runs import attempt_statuses


class Publisher(Protocol):
    """Puts a run's message for one attempt on the queue (a hint; Postgres decides); a first
    attempt at its run's `priority` (1 low, 2 normal, 3 high: runtime/flow/order.py)."""

    def publish(self, run_id: str, attempt: int, priority: int = NORMAL) -> None: ...

    def publish_many(self, runs: Sequence[QueuedAttempt]) -> None:
        """Publish several attempts' messages at once (one round trip where the broker
        batches), each at its run's priority: a process recovering hundreds of runs must not
        pay one each."""
        ...


@dataclass
class Services:
    settings: Settings
    engine: sa.Engine
    redis: redis.Redis[bytes]
    leases: Leases
    heartbeat: Heartbeat
    sealer: Sealer
    tools: ToolRegistry
    publisher: Publisher
    # Names this process in lease tokens, Redis connection names and audit: host and pid.
    holder: str
    # This process's named, always-open Redis connection: how its death is seen at once.
    presence: Presence
    # The fleet's model endpoint gates (runtime/flow/): closes set over this process's Redis,
    # heard by one subscriber of its own.
    flow: EndpointGates
    # "Run X changed" nudges: announced after the engine's writes, watched by followers of a
    # run's events (runtime/base/changes.py). The default publishes and hears nothing.
    changes: RunChanges = field(default_factory=lambda: RunChanges(None, ""))
    # Its traces (OpenTelemetry), off unless an OTLP endpoint is configured.
    tracing: Tracing = OFF

    def endpoint_of(self, model: dict[str, Any]) -> str | None:
        """The name of the model profile a run's spec resolves to (what its flow control is
        kept per), or None for a spec that names no endpoint (scripted, a framework's own)."""
        spec = specs.check(model, self.model_profiles())
        if isinstance(spec, specs.EndpointSpec):
            return spec.endpoint_name(self.model_profiles())
        return None

    def provider_for(self, model: dict[str, Any], run_id: str) -> ModelProvider:
        """The provider a model spec names, for the run `run_id` (a job asking an agent's
        model, the red-team probes, passes the agent's spec). The spec is checked again here
        against this worker's own model profiles: a worker calls only endpoints its deployment
        declares, with the key that endpoint's profile names (fail closed)."""
        try:
            spec = specs.check(model, self.model_profiles())
        except ModelError as exc:
            raise ModelError(f"run {run_id}: {exc}", retryable=False) from None
        if isinstance(spec, specs.ScriptedSpec):
            return ScriptedProvider(spec.script)
        if isinstance(spec, specs.OpenAISpec):
            from runtime.models.openai import OpenAIProvider

            return OpenAIProvider(spec, spec.endpoint(self.model_profiles()))
        if isinstance(spec, specs.AnthropicSpec):
            anthropic = need("anthropic", "runtime.models.anthropic")
            provider: ModelProvider = anthropic.AnthropicProvider(
                spec, spec.endpoint(self.model_profiles())
            )
            return provider
        return self.guest_provider(model, run_id)

    def model_profiles(self) -> dict[str, ModelProfile]:
        """The model endpoints this deployment declares (`LIYAGENT_MODEL_PROFILES`, parsed
        once per value)."""
        return profiles.parse(self.settings.model_profiles)

    def guest_provider(self, model: dict[str, Any], run_id: str) -> ModelProvider:
        """The provider of the framework agent a spec names (`runtime/toolbox/guests.py`), as
        this process's tool modules registered it."""
        name, framework = model.get("agent"), model.get("framework")
        guest = self.tools.guests.get(str(name))
        if guest is None or guest.framework != framework:
            raise ModelError(
                f"run {run_id}: the {framework} agent {name!r} is not registered in this "
                "worker; add the module that declares it (durable(agent, name=...)) to "
                "LIYAGENT_TOOLS and start the worker again",
                retryable=False,
            )
        provider: ModelProvider = guest.provider()
        return provider


def holder_of(pid: int) -> str:
    """The holder name of a process on this host: what its lease tokens carry."""
    return f"{socket.gethostname()}-{pid}"


def redis_client(
    target: RedisTarget | str,
    timeout_s: float = 2.0,
    holder: str | None = None,
    max_connections: int = db.DEFAULT_POOL_MAX,
) -> redis.Redis[bytes]:
    """The engine's Redis client: it fails fast (one immediate retry, not redis-py's default
    of ten with backoff, seconds per call), so the lease logic, not the client, decides. Each
    connection is named after its holder, so the death watch sees when it has none left.
    With Sentinels, every (re)connection goes to the master they name. Its pool opens at most
    `max_connections` (redis-py's default, 100, fails the command of a 101st thread of a
    `-c 200` pool in a command at once; runtime/base/pools.py sizes it)."""
    return client_for(
        target,
        max_connections=max_connections,
        socket_timeout=timeout_s,
        socket_connect_timeout=timeout_s,
        health_check_interval=10,
        retry=Retry(NoBackoff(), 1),
        client_name=None if holder is None else connection_name(holder),
    )


def listener_client(target: RedisTarget, name: str) -> redis.Redis[bytes]:
    """The client of one of this process's subscribers (runtime/base/listening.py): named
    apart from the holder's connections (the death watch never counts it as life), outside
    the engine's pool, no retries of its own (a broken subscription is opened again, and what
    it missed caught up, by the subscriber itself)."""
    return client_for(
        target,
        max_connections=2,
        socket_timeout=5,
        socket_connect_timeout=2,
        health_check_interval=10,
        retry=Retry(NoBackoff(), 0),
        client_name=name,
    )


def build(
    settings: Settings,
    publisher: Publisher,
    tools: ToolRegistry | None = None,
    sealer: Sealer | None = None,
) -> Services:
    holder = holder_of(os.getpid())
    name = connection_name(holder)
    target = RedisTarget.of(settings)
    client = redis_client(
        target, holder=holder, max_connections=pools.redis_pool_max(settings.redis_pool_max)
    )
    t = settings.timings
    leases = Leases(client, settings.namespace, t.lease_ttl_ms)
    presence = Presence(target, settings.namespace, holder, t.death_grace_ms)
    pooler = settings.database_pooler
    engine = db.engine_for(
        settings.database_url, pools.db_pool_max(settings.db_pool_max), name, pooler
    )
    probe = db.probe_engine(settings.database_url, f"{name}:probe", pooler)
    # Cut from Postgres alone for half a lease plus the death grace while others reach it,
    # this process gives its leases up to them (runtime/fleet/heartbeat.py, PostgresReach).
    reach = PostgresReach(
        lambda: db.ping(probe),
        leases,
        holder,
        interval_ms=max(t.heartbeat_ms // 2, 100),
        bound_ms=t.lease_ttl_ms // 2 + t.death_grace_ms,
        attempt_ms=db.PROBE_TIMEOUT_MS,
    )
    heartbeat = Heartbeat(
        leases,
        t.heartbeat_ms,
        t.stall_ms,
        presence,
        owners=owners_in(engine),
        blip_wait_ms=t.lease_ttl_ms + t.store_grace_ms,
        reach=reach,
        drops=DropWatch(listener_client(target, drops_listener(holder)), leases.dropped_channel)
        if settings.stop_push
        else None,
    )
    if sealer is None:
        sealer = load_sealer(settings.production)
        say_dev_key_once(sealer, client, settings.namespace)
    return Services(
        settings=settings,
        engine=engine,
        redis=client,
        leases=leases,
        heartbeat=heartbeat,
        sealer=sealer,
        tools=tools or registry_for(settings),
        publisher=publisher,
        holder=holder,
        presence=presence,
        flow=EndpointGates(
            client, settings.namespace, listener=listener_client(target, listener_name(holder))
        ),
        changes=RunChanges(client, settings.namespace),
        tracing=from_env(holder),
    )


def owners_in(engine: sa.Engine) -> Owners:
    """Postgres's word on where runs stand (one read): what a lease taken back after Redis
    lost its data is checked against before it is trusted (runtime/fleet/heartbeat.py)."""

    def owners(run_ids: list[str]) -> dict[str, tuple[int, str]]:
        with engine.connect() as conn:
            return {str(k): (int(a), st) for k, (a, st) in attempt_statuses(conn, run_ids).items()}

    return owners


_registry_lock = threading.Lock()
_registries: dict[tuple[tuple[str, ...], tuple[tuple[str, str], ...], str], ToolRegistry] = {}


def registry_for(settings: Settings) -> ToolRegistry:
    """The tools, agents and job kinds `LIYAGENT_TOOLS` (and entry points) declare, the
    built-in job kinds `LIYAGENT_JOB_MODULES` names, and the tools of the
    MCP servers `LIYAGENT_MCP_SERVERS` names, loaded once per process; raises
    ToolDeclarationError naming the module, server and tool that are wrong."""
    key = (
        tuple(settings.tool_modules) + tuple(f"job:{m}" for m in settings.job_modules),
        tuple(sorted(settings.tool_kinds.items())),
        settings.mcp_servers,
    )
    with _registry_lock:
        if key not in _registries:
            extra = []
            if settings.mcp_servers:
                # The MCP SDK loads only where it is configured.
                extra = need("mcp", "runtime.toolbox.mcp_tools").sources(settings.mcp_servers)
            _registries[key] = load_registry(
                settings.tool_modules,
                settings.tool_kinds,
                extra=extra,
                job_modules=settings.job_modules,
            )
        return _registries[key]


def _close_here(inherited: Services) -> None:
    """In a forked child: close, here only, the Redis sockets inherited with the parent's
    services, so a dead parent's connections close when it dies (its death is then seen)."""
    inherited.presence.close_inherited()
    close_sockets_here(inherited.redis)


_services: process.Cache[str, Services] = process.Cache(
    "runtime.services", "_services", on_drop=_close_here
)


def for_process(make: Callable[[], Services]) -> Services:
    """This process's services, built on first use; a forked child builds its own (the parent's
    are dropped at the fork, runtime/base/process.py)."""
    return _services.get("services", make)
