"""The deployment's bound on each tenant's runs in flight (runtime/flow/tenants.py), read from
`LIYAGENT_TENANT_IN_FLIGHT` and `LIYAGENT_TENANT_WEIGHTS`; a bad value is refused at start,
the setting named."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

from runtime.base.config import ConfigError

# A run's priority: the order its first message is served in and a held run's turn.
LOW, NORMAL, HIGH = 1, 2, 3
PRIORITIES = (LOW, NORMAL, HIGH)
TENANT_MAX_CHARS = 200
# The metrics' tenant label of every tenant the deployment does not name: a label's values stay
# as few as the tenants an operator chose to watch, and no owner's id reaches the metrics.
OTHER = "other"


def label_of(tenant: str | None, named: frozenset[str]) -> str:
    """A tenant as the metrics show it: by name when the deployment names it, else `OTHER`
    (so too a run stored before tenants existed, which names none)."""
    return tenant if tenant is not None and tenant in named else OTHER


@dataclass(frozen=True)
class TenantLimits:
    """Runs in flight per tenant (None: unbounded, nothing is counted or held), and weights
    that scale it for named tenants (a weight of 2: twice the bound, at least 1 run)."""

    in_flight: int | None = None
    weights: tuple[tuple[str, float], ...] = ()

    @property
    def on(self) -> bool:
        return self.in_flight is not None

    @property
    def named(self) -> frozenset[str]:
        """The tenants the deployment names (its weights): the metrics show these by name."""
        return frozenset(name for name, _ in self.weights)

    def label(self, tenant: str | None) -> str:
        """The tenant as the metrics show it (`label_of`, by this deployment's names)."""
        return label_of(tenant, self.named)

    def limit_of(self, tenant: str) -> int | None:
        """The tenant's bound on runs in flight (None when tenants are not bounded)."""
        if self.in_flight is None:
            return None
        weight = dict(self.weights).get(tenant, 1.0)
        return max(1, math.floor(self.in_flight * weight + 0.5))

    def env(self) -> dict[str, str]:
        """The environment that sets these bounds in another process (none when unbounded)."""
        if self.in_flight is None:
            return {}
        weights = ",".join(f"{name}={weight}" for name, weight in self.weights)
        return {
            "LIYAGENT_TENANT_IN_FLIGHT": str(self.in_flight),
            "LIYAGENT_TENANT_WEIGHTS": weights,
        }

    @classmethod
    def from_env(cls) -> TenantLimits:
        raw = os.environ.get("LIYAGENT_TENANT_IN_FLIGHT", "").strip()
        in_flight: int | None = None
        if raw:
            try:
                in_flight = int(raw)
            except ValueError:
                in_flight = 0
            if in_flight < 1:
                raise ConfigError(
                    f"LIYAGENT_TENANT_IN_FLIGHT={raw!r}: a tenant's runs in flight must be a "
                    "whole number of 1 or more (unset: tenants are not bounded)"
                )
        weights = _weights(os.environ.get("LIYAGENT_TENANT_WEIGHTS", ""))
        if weights and in_flight is None:
            raise ConfigError(
                "LIYAGENT_TENANT_WEIGHTS scales LIYAGENT_TENANT_IN_FLIGHT, which is unset: set "
                "it too, or remove the weights"
            )
        return cls(in_flight, weights)


def _weights(raw: str) -> tuple[tuple[str, float], ...]:
    """`tenant=weight` pairs, comma-separated; a weight is a number above 0."""
    weights: dict[str, float] = {}
    for item in filter(None, (p.strip() for p in raw.split(","))):
        name, sep, value = item.rpartition("=")
        name = name.strip()
        try:
            weight = float(value)
        except ValueError:
            weight = -1.0
        if not sep or not name or not math.isfinite(weight) or weight <= 0:
            raise ConfigError(
                f"LIYAGENT_TENANT_WEIGHTS: each entry is tenant=weight with a weight above 0 "
                f"(e.g. acme=2,trial=0.5), got {item!r}"
            )
        if len(name) > TENANT_MAX_CHARS:
            raise ConfigError(
                f"LIYAGENT_TENANT_WEIGHTS: a tenant is at most {TENANT_MAX_CHARS} characters"
            )
        weights[name] = weight
    return tuple(sorted(weights.items()))
