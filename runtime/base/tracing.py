"""Traces of runs in OpenTelemetry: a run, its attempts, their steps and calls, exported by
OTLP/HTTP when `OTEL_EXPORTER_OTLP_ENDPOINT` (or `..._TRACES_ENDPOINT`) is set; off otherwise,
and then nothing of the SDK is imported or created (`OFF`: every helper returns at once).

A run's trace context is sealed in its definition when it is enqueued (`new_run_trace`): the run
span's W3C traceparent, and the caller's span when the enqueuing code was itself traced. The
attempt spans' ids are derived from the run span's id and the attempt number (`attempt_span_id`),
so attempt n+1 links to attempt n, and writes attempt n's span when n was lost (its process
could not), with no write of its own in Postgres. Spans are exported in batches; every step
boundary and attempt end flushes them, so a SIGKILL loses at most the step in flight.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import sys
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

import structlog

from runtime.base import process
from store.errors import LiyagentError

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.trace import Span, SpanContext, Tracer

log = structlog.get_logger(__name__)

ENDPOINT_ENV = ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")
# A blocking flush slower than this (a collector slow or gone) turns flushes at boundaries off
# for `PAUSE_S`: spans then go by the batch schedule only, and steps never wait on a collector.
FLUSH_BUDGET_S = 0.5
PAUSE_S = 60.0
# Each export request's timeout when OTEL_EXPORTER_OTLP(_TRACES)_TIMEOUT does not set one.
EXPORT_TIMEOUT_S = 2.0
# How long the batch processor waits before exporting spans on its own (OTEL_BSP_SCHEDULE_DELAY
# overrides it): short, so what a boundary does not flush still leaves soon.
SCHEDULE_MS = 200
_NULL = contextlib.nullcontext()


@dataclass(frozen=True)
class RunTrace:
    """A run's trace context as stored with it: its trace id and run span id (hex), and the
    span of the code that enqueued it, when that code was traced (the run span's parent)."""

    trace_id: str
    span_id: str
    parent_span_id: str | None = None
    sampled: bool = True

    def stored(self) -> dict[str, str]:
        flags = "01" if self.sampled else "00"
        spec = {"traceparent": f"00-{self.trace_id}-{self.span_id}-{flags}"}
        if self.parent_span_id is not None:
            spec["parent"] = self.parent_span_id
        return spec

    @classmethod
    def of(cls, run_id: str, stored: Mapping[str, Any] | None) -> RunTrace:
        """The trace stored with the run; for a run enqueued before traces were stored, the one
        `new_run_trace` derives from its id alone."""
        if isinstance(stored, Mapping):
            parts = str(stored.get("traceparent", "")).split("-")
            if len(parts) == 4 and len(parts[1]) == 32 and len(parts[2]) == 16:
                parent = stored.get("parent")
                return cls(parts[1], parts[2], str(parent) if parent else None, parts[3] == "01")
        return _derived(run_id)


def _hex_id(seed: str, size: int) -> str:
    raw = hashlib.sha256(seed.encode()).hexdigest()[: size * 2]
    return raw if int(raw, 16) else "1".rjust(size * 2, "0")  # an all-zero id is invalid


def _derived(run_id: str) -> RunTrace:
    return RunTrace(run_id.replace("-", "").lower(), _hex_id(f"run:{run_id}", 8))


def new_run_trace(run_id: str) -> dict[str, str]:
    """The trace context a new run is stored with: a trace of its own whose id is the run's id
    (a trace is found from the run), or, when the enqueuing code runs inside a traced span
    (an app that traces its requests; a worker enqueuing a sub-agent's run from a call span),
    that span's trace, the run span its child. Costs no SDK object when the code is untraced."""
    mine = _derived(run_id)
    api = sys.modules.get("opentelemetry.trace")
    if api is not None:
        caller = api.get_current_span().get_span_context()
        if caller.is_valid:
            return RunTrace(
                format(caller.trace_id, "032x"),
                mine.span_id,
                format(caller.span_id, "016x"),
                caller.trace_flags.sampled,
            ).stored()
    return mine.stored()


def attempt_span_id(run: RunTrace, attempt: int) -> str:
    """The span id of a run's attempt: a pure function of the run span and the number, so the
    next attempt links to it (and writes it, lost) without reading anything."""
    return _hex_id(f"{run.span_id}:attempt:{attempt}", 8)


def _ns(at: datetime | None) -> int | None:
    return None if at is None else int(at.timestamp() * 1e9)


@dataclass(frozen=True)
class AttemptFacts:
    """What an attempt's spans say of it, from the run row its claim returned."""

    run_id: str
    agent: str
    kind: str
    attempt: int
    # The run's stored trace context (its definition's `trace`; None for a run without one).
    trace: Mapping[str, Any] | None
    resume_reason: str | None
    created_at: datetime | None
    # When the previous attempt was seen lost (the loss claim set `queued_at`), and its last
    # checkpoint's time when that attempt wrote it: the lost span's end and start.
    lost_at: datetime | None
    lost_checkpoint_at: datetime | None
    # Whether the previous attempt's process is known dead (its loss seen by its connections
    # closing, or its pool child dying): only then does nobody else ever end its span.
    lost_dead: bool = False


class Tracing:
    """One process's tracer, or nothing (`OFF`). Every helper is a no-op when off."""

    def __init__(self, provider: TracerProvider | None = None) -> None:
        self.provider = provider
        self.on = provider is not None
        self._tracer: Tracer | None = None if provider is None else provider.get_tracer("liyagent")
        self._paused_until = 0.0
        self._lock = threading.Lock()

    @property
    def tracer(self) -> Tracer:
        assert self._tracer is not None
        return self._tracer

    def attempt(self, facts: AttemptFacts) -> AttemptSpan | None:
        """Start an attempt's span, current until `AttemptSpan.end`; None when off."""
        if self._tracer is None:
            return None
        return AttemptSpan(self, facts)

    def step(self, step: int, resumed: bool = False) -> contextlib.AbstractContextManager[Any]:
        """A model step's span: its model request, checkpoint and calls (a resume's step: the
        calls its checkpoint left)."""
        if self._tracer is None:
            return _NULL
        return self._span("liyagent.step", {"liyagent.step": step, "liyagent.resumed": resumed})

    def model_request(self, step: int) -> contextlib.AbstractContextManager[Any]:
        if self._tracer is None:
            return _NULL
        return self._span("liyagent.model_request", {"liyagent.step": step}, client=True)

    def call(self, tool: str, index: int, call_id: str) -> contextlib.AbstractContextManager[Any]:
        """A tool call's span; the router adds its kind, key and settlement (`settled`)."""
        if self._tracer is None:
            return _NULL
        attrs = {"liyagent.call.tool": tool, "liyagent.call.index": index}
        return self._span("liyagent.call", {**attrs, "liyagent.call.id": call_id})

    def call_key(self, key: str) -> None:
        """The step key the call in flight is made with (on its span)."""
        if self._tracer is not None:
            _current().set_attribute("liyagent.call.key", key)

    def model_usage(self, input_tokens: int, output_tokens: int, model: str | None) -> None:
        """The usage the model request in flight was answered with, on its span, as the
        OpenTelemetry GenAI conventions name it (gen_ai.usage.*, gen_ai.response.model)."""
        if self._tracer is not None:
            span = _current()
            span.set_attribute("gen_ai.usage.input_tokens", input_tokens)
            span.set_attribute("gen_ai.usage.output_tokens", output_tokens)
            if model:
                span.set_attribute("gen_ai.response.model", model)

    def event(self, name: str, details: Mapping[str, Any]) -> None:
        """An event on the span in flight (a step's model request waiting for its endpoint,
        a 429 met): its details as `liyagent.<name>` attributes, None values left out. Only
        the flow's own words go here (an endpoint's profile, a reason, ms), never a secret."""
        if self._tracer is not None:
            attrs = {f"liyagent.{k}": v for k, v in details.items() if v is not None}
            _current().add_event(name, attrs)

    def settled(self, span: Any, kind: str, settlement: str) -> None:
        if span is not None:
            span.set_attribute("liyagent.call.kind", kind)
            span.set_attribute("liyagent.call.settlement", settlement)

    @contextlib.contextmanager
    def _span(self, name: str, attrs: dict[str, Any], client: bool = False) -> Iterator[Span]:
        from opentelemetry.trace import SpanKind, StatusCode

        kind = SpanKind.CLIENT if client else SpanKind.INTERNAL
        # Exceptions are not recorded: their messages may carry user text (never exported);
        # the span says the type only.
        with self.tracer.start_as_current_span(
            name, kind=kind, attributes=attrs, record_exception=False, set_status_on_exception=False
        ) as span:
            try:
                yield span
            except BaseException as exc:
                span.set_status(StatusCode.ERROR, type(exc).__name__)
                raise

    def flush(self) -> None:
        """Export every ended span now (a step boundary, an attempt's end), unless a slow
        flush paused flushing: then the batch schedule exports them."""
        if self.provider is None or time.monotonic() < self._paused_until:
            return
        started = time.monotonic()
        self.provider.force_flush()
        took = time.monotonic() - started
        if took > FLUSH_BUDGET_S:
            self._paused_until = time.monotonic() + PAUSE_S
            log.warning(
                "traces.flush_slow",
                took_s=round(took, 3),
                next=f"spans go by the batch schedule for {PAUSE_S:.0f} s; check the collector",
            )

    def shutdown(self) -> None:
        """Export what is left and stop (a pool child's exit, a worker's shutdown)."""
        if self.provider is not None:
            self.provider.shutdown()
            self.provider, self._tracer, self.on = None, None, False


def _current() -> Span:
    from opentelemetry import trace

    return trace.get_current_span()


class AttemptSpan:
    """An attempt's span, parented by the run span, linked to the previous attempt; current
    (its steps nest under it) until `end`, which also writes the run span if the run ended."""

    def __init__(self, tracing: Tracing, facts: AttemptFacts) -> None:
        from opentelemetry import context, trace

        self.tracing = tracing
        self.facts = facts
        self.run = RunTrace.of(facts.run_id, facts.trace)
        attrs: dict[str, str | int] = {
            "liyagent.run.id": facts.run_id,
            "liyagent.agent": facts.agent,
            "liyagent.attempt": facts.attempt,
        }
        links = []
        if facts.attempt > 1:
            previous = self._context(attempt_span_id(self.run, facts.attempt - 1))
            reason = facts.resume_reason or "resumed"
            links.append(
                trace.Link(previous, {"liyagent.link": "previous_attempt", "reason": reason})
            )
            attrs["liyagent.resume_reason"] = reason
            if facts.resume_reason == "lost" and facts.lost_dead:
                # Its process died and never ended its span: written here, once, and sent
                # now (not at this attempt's first boundary, which it may not reach). A loss
                # seen by its lease lapsing may be a stalled or failed attempt that ends (or
                # ended) its own span: writing one here would make two with one id.
                self._write_lost(facts.attempt - 1, previous)
                tracing.flush()
        with _preset(attempt_span_id(self.run, facts.attempt)):
            self.span = tracing.tracer.start_span(
                "liyagent.attempt",
                context=trace.set_span_in_context(
                    trace.NonRecordingSpan(self._context(self.run.span_id))
                ),
                attributes=attrs,
                links=links,
            )
        self._token = context.attach(trace.set_span_in_context(self.span))

    def _context(self, span_id: str) -> SpanContext:
        from opentelemetry.trace import SpanContext, TraceFlags

        flags = TraceFlags(TraceFlags.SAMPLED if self.run.sampled else TraceFlags.DEFAULT)
        return SpanContext(int(self.run.trace_id, 16), int(span_id, 16), True, flags)

    def _write_lost(self, attempt: int, lost: SpanContext) -> None:
        """The lost attempt's own span, which its killed process never ended: from its last
        checkpoint (or the moment it was seen lost) to that moment, marked lost."""
        from opentelemetry import trace
        from opentelemetry.trace import StatusCode

        end = _ns(self.facts.lost_at) or time.time_ns()
        start = min(_ns(self.facts.lost_checkpoint_at) or end, end)
        parent = trace.set_span_in_context(trace.NonRecordingSpan(self._context(self.run.span_id)))
        with _preset(format(lost.span_id, "016x")):
            span = self.tracing.tracer.start_span(
                "liyagent.attempt",
                context=parent,
                start_time=start,
                attributes={
                    "liyagent.run.id": self.facts.run_id,
                    "liyagent.attempt": attempt,
                    "liyagent.attempt.lost": True,
                },
            )
        span.set_status(StatusCode.ERROR, "lost: its process died; written by the next attempt")
        span.end(end_time=end)

    def end(self, outcome: str, run_ended: bool) -> None:
        """End the attempt's span with how it ended; the run span too when the run ended; then
        flush, so nothing of the attempt waits on a process that may be recycled next."""
        from opentelemetry import context, trace

        context.detach(self._token)
        self.span.set_attribute("liyagent.outcome", outcome)
        self.span.end()
        if run_ended:
            parent = None
            if self.run.parent_span_id is not None:
                caller = self._context(self.run.parent_span_id)
                parent = trace.set_span_in_context(trace.NonRecordingSpan(caller))
            with _preset(self.run.span_id, self.run.trace_id):
                span = self.tracing.tracer.start_span(
                    "liyagent.run",
                    context=parent or context.Context(),
                    start_time=_ns(self.facts.created_at),
                    attributes={
                        "liyagent.run.id": self.facts.run_id,
                        "liyagent.agent": self.facts.agent,
                        "liyagent.run.kind": self.facts.kind,
                        "liyagent.attempts": self.facts.attempt,
                        "liyagent.outcome": outcome,
                    },
                )
            span.end()
        self.tracing.flush()


# The ids the next span started on this thread takes (the run's and its attempts' spans have
# ids derived from the run), read once by `_Ids`.
_next = threading.local()


@contextlib.contextmanager
def _preset(span_id: str, trace_id: str | None = None) -> Iterator[None]:
    _next.span_id, _next.trace_id = (
        int(span_id, 16),
        None if trace_id is None else int(trace_id, 16),
    )
    try:
        yield
    finally:
        _next.span_id = _next.trace_id = None


def _taken(name: str) -> int | None:
    """The id `_preset` named for this thread's next span, once."""
    preset: int | None = getattr(_next, name, None)
    setattr(_next, name, None)
    return preset


def _id_generator() -> Any:
    from opentelemetry.sdk.trace.id_generator import RandomIdGenerator

    class _Ids(RandomIdGenerator):
        """Random ids, except the ones `_preset` names for the next span of this thread."""

        def generate_span_id(self) -> int:
            return _taken("span_id") or super().generate_span_id()

        def generate_trace_id(self) -> int:
            return _taken("trace_id") or super().generate_trace_id()

    return _Ids()


OFF = Tracing()
# The tracers this process built, flushed when it exits (`shutdown_here`).
_live: process.Cache[int, Tracing] = process.Cache("runtime.base.tracing", "_live")


def endpoint(env: Mapping[str, str] | None = None) -> str | None:
    """The OTLP endpoint the environment names, or None (traces off)."""
    env = os.environ if env is None else env
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return None
    for name in ENDPOINT_ENV:
        if env.get(name, "").strip():
            return env[name].strip()
    return None


class TracesUnavailable(LiyagentError, RuntimeError):
    """An OTLP endpoint is configured but the SDK or its exporter is not installed."""


def check_installed() -> None:
    """Refuse (TracesUnavailable, saying what to do) when traces are asked for and cannot be
    exported: an operator who set the endpoint expects them; a silent absence misleads."""
    if endpoint() is None:
        return
    try:
        import opentelemetry.exporter.otlp.proto.http.trace_exporter
        import opentelemetry.sdk.trace  # noqa: F401
    except ImportError as exc:
        raise TracesUnavailable(
            f"OTEL_EXPORTER_OTLP_ENDPOINT is set but {exc.name} is not installed: install "
            "liyagent[otel], or unset the variable to run without traces"
        ) from None


def from_env(holder: str) -> Tracing:
    """This process's tracing: OTLP/HTTP batches to the configured endpoint, or `OFF` (no SDK
    import, no object). The SDK reads its usual variables (headers, timeout, OTEL_SERVICE_NAME,
    OTEL_RESOURCE_ATTRIBUTES, OTEL_BSP_*)."""
    if endpoint() is None:
        return OFF
    check_installed()
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    timeout = None
    if not any(os.environ.get(f"OTEL_EXPORTER_OTLP{t}_TIMEOUT") for t in ("", "_TRACES")):
        timeout = EXPORT_TIMEOUT_S
    resource = Resource.create(
        {"service.name": os.environ.get("OTEL_SERVICE_NAME", "liyagent"), "liyagent.holder": holder}
    )
    provider = TracerProvider(
        resource=resource, id_generator=_id_generator(), shutdown_on_exit=False
    )
    schedule = None if os.environ.get("OTEL_BSP_SCHEDULE_DELAY") else SCHEDULE_MS
    provider.add_span_processor(
        BatchSpanProcessor(OTLPSpanExporter(timeout=timeout), schedule_delay_millis=schedule)
    )
    tracing = Tracing(provider)
    _live.get(id(tracing), lambda: tracing)
    log.info("traces.on")  # not the endpoint: a URL may carry credentials
    return tracing


def shutdown_here() -> None:
    """Flush and stop every tracing this process built (a pool child about to exit: a recycled
    child's spans are exported, not lost with it); inherited ones are left to their owner (a
    child forgets them at the fork)."""
    for tracing in _live.take_all():
        try:
            tracing.shutdown()
        except Exception as exc:  # never stop an exit on a collector
            log.warning("traces.shutdown_failed", error=type(exc).__name__)
