"""The model endpoints' flow, fleet-wide, as Prometheus families (issue 33, item 5): read at
scrape time like every other figure (runtime/ops/metrics.py), never counted in a process.

From Redis, the counters the flow's own scripts keep in `flow:stats` (field
`<counter>:<profile>:<tenant>`, the tenant as `TenantLimits.label` shows it): requests admitted
under an endpoint's limits and waits answered by them
(`lua/admit.lua`, so only endpoints that declare limits count admissions), 429s met
(`lua/close.lua`), waits on a close (one HINCRBY as a step starts to wait). From Postgres, the
runs suspended on each endpoint now, by tenant (store/views.py `TENANT_SQL`). Every family's
tenant label: the tenants the deployment names in LIYAGENT_TENANT_WEIGHTS by name, all others
as `other`.

Families: liyagent_model_requests_admitted_total{endpoint,tenant},
liyagent_model_waits_total{endpoint,tenant,how} (how: in_place, suspended),
liyagent_model_rate_limited_total{endpoint,tenant} and
liyagent_model_waiting_runs{endpoint,tenant}.
"""

from __future__ import annotations

from collections.abc import Mapping

from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric

from runtime.base.tenancy import OTHER, label_of
from store.views import ModelWaiting

# The counters' names in `flow:stats`, and the family and label value each is shown as.
ADMITTED = "admitted"
WAITS = {"waits_in_place": "in_place", "waits_suspended": "suspended"}
RATE_LIMITED = "rate_limited"


def counter_families(stats: Mapping[bytes, bytes]) -> list[Metric]:
    """The fleet's counters per endpoint and tenant, from the `flow:stats` hash as read
    (HGETALL; a field of an earlier version, which names no tenant, counts as `other`)."""
    admitted = CounterMetricFamily(
        "liyagent_model_requests_admitted",
        "Model requests admitted under their endpoint's limits (endpoints that declare limits)",
        labels=["endpoint", "tenant"],
    )
    waits = CounterMetricFamily(
        "liyagent_model_waits",
        "Waits of model steps for their endpoint (closed by a 429, or at a limit): in place, "
        "or suspended (the run holding no worker)",
        labels=["endpoint", "tenant", "how"],
    )
    limited = CounterMetricFamily(
        "liyagent_model_rate_limited",
        "Model requests answered 429 (each closes its endpoint for the fleet)",
        labels=["endpoint", "tenant"],
    )
    for raw, value in sorted((_text(k), float(_text(v))) for k, v in stats.items()):
        counter, _, rest = raw.partition(":")
        endpoint, _, tenant = rest.partition(":")
        tenant = tenant or OTHER
        if counter == ADMITTED:
            admitted.add_metric([endpoint, tenant], value)
        elif counter in WAITS:
            waits.add_metric([endpoint, tenant, WAITS[counter]], value)
        elif counter == RATE_LIMITED:
            limited.add_metric([endpoint, tenant], value)
    return [admitted, waits, limited]


def waiting_family(waiting: list[ModelWaiting], named: frozenset[str] = frozenset()) -> Metric:
    """Runs suspended on each model endpoint now, by tenant: those the deployment names
    (LIYAGENT_TENANT_WEIGHTS) by name, every other one as `other`."""
    family = GaugeMetricFamily(
        "liyagent_model_waiting_runs",
        "Runs waiting now (suspended, holding no worker) for a model endpoint's capacity",
        labels=["endpoint", "tenant"],
    )
    counts: dict[tuple[str, str], int] = {}
    for w in waiting:
        key = (w.endpoint, label_of(w.tenant, named))
        counts[key] = counts.get(key, 0) + w.n
    for (endpoint, tenant), n in sorted(counts.items()):
        family.add_metric([endpoint, tenant], float(n))
    return family


def _text(raw: bytes | str) -> str:
    return raw.decode() if isinstance(raw, bytes) else raw
