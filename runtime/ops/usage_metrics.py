"""The ledger's Prometheus counters (issue 34), read from Postgres at scrape time like every
family of runtime/ops/metrics.py: tokens by kind (input, output, cached) and whether they are
exact (written steps) or unconfirmed (lost attempts' reservations), and dollars the same way,
by tenant as the deployment names them (runtime/base/tenancy.py `label_of`: any other tenant
is `other`). No run id, agent or model is a label, so the series stay bounded.

They sum the rows Postgres holds: a run retention deletes takes its usage with it, which a
Prometheus counter reads as a reset."""

from __future__ import annotations

from collections.abc import Sequence

from prometheus_client.metrics_core import CounterMetricFamily, Metric

from runtime.base.tenancy import label_of
from store.ledger import UsageLine

KINDS = ("input", "output", "cached")
CONFIRMED = ("exact", "unconfirmed")


def usage_families(lines: Sequence[UsageLine], named: frozenset[str] = frozenset()) -> list[Metric]:
    """liyagent_model_tokens_total{kind,confirmed,tenant} and
    liyagent_model_cost_usd_total{confirmed,tenant} from the usage by tenant."""
    tokens: dict[tuple[str, str, str], float] = {}
    dollars: dict[tuple[str, str], float] = {}
    for line in lines:
        tenant = label_of(line.key, named)
        counts = {
            ("input", "exact"): line.input_tokens,
            ("output", "exact"): line.output_tokens,
            ("cached", "exact"): line.cached_tokens,
            ("input", "unconfirmed"): line.unconfirmed_input_tokens,
            ("output", "unconfirmed"): line.unconfirmed_output_tokens,
        }
        for (kind, confirmed), n in counts.items():
            key = (kind, confirmed, tenant)
            tokens[key] = tokens.get(key, 0.0) + n
        for confirmed, usd in (
            ("exact", line.cost_usd),
            ("unconfirmed", line.unconfirmed_cost_usd),
        ):
            dollars[(confirmed, tenant)] = dollars.get((confirmed, tenant), 0.0) + float(usd)
    token_family = CounterMetricFamily(
        "liyagent_model_tokens",
        "Model tokens runs used: exact (written steps, counted once) or unconfirmed (what lost "
        "attempts reserved for steps they never wrote), by kind and tenant",
        labels=["kind", "confirmed", "tenant"],
    )
    for (kind, confirmed, tenant), count in sorted(tokens.items()):
        token_family.add_metric([kind, confirmed, tenant], count)
    cost_family = CounterMetricFamily(
        "liyagent_model_cost_usd",
        "US dollars of those tokens at the prices in force when each was recorded (unpriced "
        "models add nothing), exact or unconfirmed, by tenant",
        labels=["confirmed", "tenant"],
    )
    for (confirmed, tenant), total in sorted(dollars.items()):
        cost_family.add_metric([confirmed, tenant], total)
    return [token_family, cost_family]
