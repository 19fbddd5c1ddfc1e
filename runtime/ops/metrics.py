"""Prometheus metrics, collected at scrape time from Postgres and Redis (never kept in memory).

Workers are many processes on many hosts, so no process can count for the others: each scrape
reads the tallies Postgres and Redis hold. Served by `liyagent metrics` and by the front's
`/metrics`, which, like Flower's, needs no token: bind either to a private interface.

Families: liyagent_runs{status}, liyagent_runs_by_kind{kind,status}, liyagent_waiting_runs
{waiting_on}, liyagent_queue_age_seconds, liyagent_resumes_total, liyagent_handbacks_total,
liyagent_losses_total, liyagent_runs_failed_total{code}, liyagent_settlements_total
{settlement}, liyagent_recovery_seconds (histogram), liyagent_fencing_rejections_total,
liyagent_sweep_duration_seconds (summary), liyagent_retention_deleted_total{what},
liyagent_retention_batches_total and liyagent_source_up{source}; the model endpoints' flow
(runtime/ops/flow_metrics.py): liyagent_model_requests_admitted_total{endpoint},
liyagent_model_waits_total{endpoint,how}, liyagent_model_rate_limited_total{endpoint} and
liyagent_model_waiting_runs{endpoint,tenant}; the ledger (runtime/ops/usage_metrics.py):
liyagent_model_tokens_total{kind,confirmed,tenant} and
liyagent_model_cost_usd_total{confirmed,tenant}.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator

import redis
import sqlalchemy as sa
import structlog
from prometheus_client import generate_latest
from prometheus_client.metrics_core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
    SummaryMetricFamily,
)
from prometheus_client.registry import CollectorRegistry

from runtime.flow.limits import stats_key
from runtime.ops.flow_metrics import counter_families, waiting_family
from runtime.ops.retention import BATCHES, COUNTERS
from runtime.ops.usage_metrics import usage_families
from store import views
from store.ledger import usage_by_tenant
from store.schema import RUN_STATUSES

log = structlog.get_logger(__name__)

RUN_KINDS = ("agent", "workflow", "job")
# What a waiting run waits on (the prefix of its waiting_on; model: an endpoint closed by a 429).
WAITING_ON = ("approval", "child", "timer", "model")
RECOVERY_BUCKETS_S = (1.0, 2.0, 3.0, 5.0, 8.0, 13.0, 21.0, 34.0, 55.0)
SWEEP_QUANTILES = (0.5, 0.9, 0.99)


class LiyagentCollector:
    """Reads every figure afresh on each `collect`. Not strict: a source that fails is logged
    and reported as liyagent_source_up 0, its families left out. Strict: the error is raised."""

    def __init__(
        self,
        engine: sa.Engine,
        client: redis.Redis[bytes],
        namespace: str,
        *,
        strict: bool = False,
        named_tenants: frozenset[str] = frozenset(),
    ) -> None:
        self.engine = engine
        self.redis = client
        self.namespace = namespace
        self.strict = strict
        # The tenants shown by name (the rest as `other`: flow_metrics.py).
        self.named_tenants = named_tenants

    def collect(self) -> Iterator[Metric]:
        """All families: Postgres's, then Redis's, then whether each source answered."""
        up = GaugeMetricFamily(
            "liyagent_source_up", "1 if the source answered this scrape, else 0", labels=["source"]
        )
        for source, read in (("postgres", self._postgres), ("redis", self._redis)):
            families = self._guarded(source, read)
            up.add_metric([source], 0.0 if families is None else 1.0)
            yield from families or []
        yield up

    def _guarded(self, source: str, read: Callable[[], list[Metric]]) -> list[Metric] | None:
        try:
            return read()
        except Exception as exc:
            if self.strict:
                raise
            log.warning(
                "metrics.source_down",
                source=source,
                error=f"{type(exc).__name__}: {exc}",
                next=f"check LIYAGENT_{source.upper()}_URL and that {source} is running",
            )
            return None

    def _postgres(self) -> list[Metric]:
        """One read-only, repeatable-read transaction, so the figures agree with each other."""
        with self.engine.connect() as conn:
            conn.execution_options(isolation_level="REPEATABLE READ", postgresql_readonly=True)
            with conn.begin():
                return postgres_families(conn, self.named_tenants)

    def _redis(self) -> list[Metric]:
        ns = self.namespace
        fenced = self.redis.get(f"{ns}metrics:fenced_total")
        sweeps = [float(v) / 1000.0 for v in self.redis.lrange(f"{ns}metrics:sweep_ms", 0, -1)]
        count = int(self.redis.get(f"{ns}metrics:sweep_count") or 0)
        total_s = float(self.redis.get(f"{ns}metrics:sweep_ms_total") or 0) / 1000.0
        counter = CounterMetricFamily(
            "liyagent_fencing_rejections_total",
            "Attempts stopped because another attempt owns their run (counted in Redis)",
        )
        counter.add_metric([], float(fenced or 0))
        flow = counter_families(self.redis.hgetall(stats_key(ns)))
        return [counter, sweep_summary(sweeps, count, total_s), *self._retention(), *flow]

    def _retention(self) -> list[Metric]:
        """What retention deleted (runtime/ops/retention.py counts each batch in Redis)."""
        ns = self.namespace
        deleted = CounterMetricFamily(
            "liyagent_retention_deleted",
            "Rows retention deleted: finished runs (with what hung on them) and audit rows",
            labels=["what"],
        )
        for what, key in COUNTERS.items():
            deleted.add_metric([what], float(self.redis.get(f"{ns}{key}") or 0))
        batches = CounterMetricFamily(
            "liyagent_retention_batches", "Retention batches run (one statement each)"
        )
        batches.add_metric([], float(self.redis.get(f"{ns}{BATCHES}") or 0))
        return [deleted, batches]


def postgres_families(
    conn: sa.Connection, named_tenants: frozenset[str] = frozenset()
) -> list[Metric]:
    """Every family read from Postgres (`named_tenants`: shown by name, the rest as other)."""
    return [
        *run_families(views.run_counts(conn)),
        *waiting_families(views.waiting_counts(conn), views.oldest_queued_age_s(conn)),
        *loss_families(views.loss_tally(conn), views.failures_by_code(conn)),
        labelled_counter(
            "liyagent_settlements_total",
            "Marked calls with an outcome by how they ended: sent on the first pass, or how a "
            "resume settled them (resent, read_back, sent_after_read_back, reused, unknown)",
            "settlement",
            views.settlement_counts(conn),
        ),
        recovery_histogram(views.recovery_histogram(conn, list(RECOVERY_BUCKETS_S))),
        waiting_family(views.model_waiting_counts(conn), named_tenants),
        *usage_families(usage_by_tenant(conn), named_tenants),
    ]


def run_families(counts: list[views.RunCount]) -> list[Metric]:
    """Runs by status, and by kind and status, every known pair shown (zeros included)."""
    by_status = dict.fromkeys(RUN_STATUSES, 0)
    by_kind = {(k, s): 0 for k in RUN_KINDS for s in RUN_STATUSES}
    for c in counts:
        by_status[c.status] = by_status.get(c.status, 0) + c.n
        by_kind[(c.kind, c.status)] = c.n
    runs = GaugeMetricFamily("liyagent_runs", "Runs by status now", labels=["status"])
    for status, n in by_status.items():
        runs.add_metric([status], float(n))
    kinds = GaugeMetricFamily(
        "liyagent_runs_by_kind", "Runs by kind and status now", labels=["kind", "status"]
    )
    for (kind, status), n in by_kind.items():
        kinds.add_metric([kind, status], float(n))
    return [runs, kinds]


def waiting_families(waiting: dict[str, int], queue_age_s: float) -> list[Metric]:
    """Waiting runs by what they wait on, and how long the oldest queued run has waited."""
    family = GaugeMetricFamily(
        "liyagent_waiting_runs",
        "Runs waiting (holding no worker) by what they wait on",
        labels=["waiting_on"],
    )
    for on_what, n in {**dict.fromkeys(WAITING_ON, 0), **waiting}.items():
        family.add_metric([on_what], float(n))
    age = GaugeMetricFamily(
        "liyagent_queue_age_seconds",
        "Seconds the longest-queued run has been queued (0 when none is)",
        value=queue_age_s,
    )
    return [family, age]


def loss_families(tally: views.LossTally, failures: dict[str, int]) -> list[Metric]:
    """Resumes, hand-backs and losses from the audit, and failures by code."""
    return [
        CounterMetricFamily(
            "liyagent_resumes_total",
            "Runs resumed after a loss (audited agent.run.crash_resumed)",
            value=float(tally.crash_resumed),
        ),
        CounterMetricFamily(
            "liyagent_handbacks_total",
            "Attempts handed back to the queue (audited agent.run.handed_back)",
            value=float(tally.handed_back),
        ),
        CounterMetricFamily(
            "liyagent_losses_total",
            "Lapsed leases claimed by the sweeper: runs requeued (agent.run.lost) or failed",
            value=float(tally.lost + tally.failed_by_loss),
        ),
        labelled_counter(
            "liyagent_runs_failed_total",
            "Runs failed, by the code of their agent.run.failed audit event",
            "code",
            failures,
        ),
    ]


def labelled_counter(name: str, doc: str, label: str, counts: dict[str, int]) -> Metric:
    """A counter family with one label, one sample per value counted."""
    family = CounterMetricFamily(name, doc, labels=[label])
    for value, n in counts.items():
        family.add_metric([value], float(n))
    return family


def recovery_histogram(h: views.DurationHistogram) -> Metric:
    """Loss-to-resume times as a histogram with the RECOVERY_BUCKETS_S bounds."""
    buckets = [(_label(b), float(n)) for b, n in zip(RECOVERY_BUCKETS_S, h.cumulative, strict=True)]
    return HistogramMetricFamily(
        "liyagent_recovery_seconds",
        "Seconds from a run's loss (agent.run.lost) to its resume (agent.run.crash_resumed)",
        buckets=[*buckets, ("+Inf", float(h.count))],
        sum_value=h.sum_s,
    )


def sweep_summary(durations_s: list[float], count: int, total_s: float) -> Metric:
    """Every sweep's count and total duration (running totals kept in Redis), and quantiles
    over the latest sweeps (a window of up to 1000; NaN when none is recorded)."""
    family = SummaryMetricFamily(
        "liyagent_sweep_duration_seconds",
        "Sweep durations: count and sum of every sweep; quantiles over the latest 1000",
        count_value=count,
        sum_value=total_s,
    )
    ordered = sorted(durations_s)
    for q in SWEEP_QUANTILES:
        family.add_sample(
            "liyagent_sweep_duration_seconds",
            {"quantile": _label(q)},
            quantile(ordered, q),
        )
    return family


def quantile(ordered: list[float], q: float) -> float:
    """The nearest-rank quantile of sorted values; NaN for none."""
    if not ordered:
        return math.nan
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


def _label(bound: float) -> str:
    """A bound or quantile as a label value, as Prometheus clients write them (`1.0`, `0.99`)."""
    return repr(float(bound))


def registry_for(
    engine: sa.Engine,
    client: redis.Redis[bytes],
    namespace: str,
    *,
    strict: bool = False,
    named_tenants: frozenset[str] = frozenset(),
) -> CollectorRegistry:
    """A fresh registry holding only the liyagent collector over this Postgres and this Redis
    namespace (no process metrics: they would describe one scraping process, not the
    deployment; see LiyagentCollector for `strict`)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(
        LiyagentCollector(engine, client, namespace, strict=strict, named_tenants=named_tenants)
    )
    return registry


def exposition(
    engine: sa.Engine,
    client: redis.Redis[bytes],
    namespace: str,
    named_tenants: frozenset[str] = frozenset(),
) -> str:
    """The text exposition once, strictly: a source that cannot be read raises."""
    registry = registry_for(engine, client, namespace, strict=True, named_tenants=named_tenants)
    return generate_latest(registry).decode("utf-8")
