"""Everything a process needs, built once per process from settings: engine, Redis, leases,
heartbeat, sealer, tools and the publisher that puts run messages on the queue."""

from __future__ import annotations

import os
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import redis
import sqlalchemy as sa
from redis.backoff import NoBackoff
from redis.retry import Retry

from runtime.heartbeat import Heartbeat
from runtime.leases import Leases
from runtime.models.base import ModelError, ModelProvider, StepRequest
from runtime.models.scripted import ScriptedProvider
from runtime.sealing import Sealer, load_sealer
from runtime.settings import Settings
from runtime.tools import ToolRegistry
from runtime.vendor_tools import default_registry
from store import db
from store.records import insert_model_request
from store.rows import RunRow


class Publisher(Protocol):
    """Puts a run's message for one attempt on the queue (a hint; Postgres decides)."""

    def publish(self, run_id: str, attempt: int) -> None: ...


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
    # Names this process in lease tokens and audit: host and pid.
    holder: str

    def model_for(self, run: RunRow) -> ModelProvider:
        """The provider the run's spec names; each records every request it serves."""
        model: dict[str, Any] = dict(run.spec.get("model") or {})
        provider = model.get("provider", "scripted")
        if provider == "scripted":
            return ScriptedProvider(model.get("script") or {}, record=self._record_request)
        if provider == "openai":
            from runtime.models.openai import OpenAIProvider

            return OpenAIProvider(model, record=self._record_request)
        raise ModelError(
            f"run {run.id}: model provider {provider!r} is not available in this worker",
            retryable=False,
        )

    def _record_request(self, request: StepRequest, provider: str) -> None:
        with self.engine.connect() as conn:
            insert_model_request(
                conn,
                run_id=request.run_id,
                step=request.step,
                attempt=request.attempt,
                provider=provider,
                tool_results=request.latest_tool_results(),
            )


def redis_client(url: str, timeout_s: float = 2.0) -> redis.Redis[bytes]:
    """The engine's Redis client: it fails fast (one immediate retry, not redis-py's default
    of ten with backoff, seconds per call), so the lease logic, not the client, decides."""
    return redis.Redis.from_url(
        url,
        socket_timeout=timeout_s,
        socket_connect_timeout=timeout_s,
        health_check_interval=10,
        retry=Retry(NoBackoff(), 1),
    )


def build(
    settings: Settings,
    publisher: Publisher,
    tools: ToolRegistry | None = None,
    sealer: Sealer | None = None,
) -> Services:
    client = redis_client(settings.redis_url)
    t = settings.timings
    leases = Leases(client, settings.namespace, t.lease_ttl_ms)
    return Services(
        settings=settings,
        engine=db.engine_for(settings.database_url),
        redis=client,
        leases=leases,
        heartbeat=Heartbeat(leases, t.heartbeat_ms, t.stall_ms),
        sealer=sealer or load_sealer(settings.production),
        tools=tools or default_registry(settings.vendor_url, settings.tool_kinds),
        publisher=publisher,
        holder=f"{socket.gethostname()}-{os.getpid()}",
    )


_lock = threading.Lock()
_cache: dict[int, Services] = {}


def for_process(make: Callable[[], Services]) -> Services:
    """This process's services, built on first use; a forked child builds its own."""
    pid = os.getpid()
    with _lock:
        if pid not in _cache:
            _cache.clear()
            _cache[pid] = make()
        return _cache[pid]
