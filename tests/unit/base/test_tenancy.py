"""Tenant bounds from the environment: a bound of 1 or more, weights that scale it; anything
else is refused at start with the setting named."""

from __future__ import annotations

import pytest

from runtime.base.config import ConfigError
from runtime.base.tenancy import TenantLimits


def _limits(monkeypatch: pytest.MonkeyPatch, in_flight: str, weights: str = "") -> TenantLimits:
    monkeypatch.setenv("LIYAGENT_TENANT_IN_FLIGHT", in_flight)
    monkeypatch.setenv("LIYAGENT_TENANT_WEIGHTS", weights)
    return TenantLimits.from_env()


def test_unset_bounds_nobody(monkeypatch: pytest.MonkeyPatch) -> None:
    limits = _limits(monkeypatch, "")
    assert not limits.on and limits.limit_of("acme") is None


def test_weights_scale_the_bound_and_never_below_one(monkeypatch: pytest.MonkeyPatch) -> None:
    limits = _limits(monkeypatch, "4", "acme=2, trial=0.1,half=0.5")
    assert [limits.limit_of(t) for t in ("acme", "trial", "half", "other")] == [8, 1, 2, 4]


@pytest.mark.parametrize(
    ("in_flight", "weights", "named"),
    [
        ("0", "", "LIYAGENT_TENANT_IN_FLIGHT"),
        ("-3", "", "LIYAGENT_TENANT_IN_FLIGHT"),
        ("many", "", "LIYAGENT_TENANT_IN_FLIGHT"),
        ("", "acme=2", "LIYAGENT_TENANT_IN_FLIGHT, which is unset"),
        ("4", "acme=0", "LIYAGENT_TENANT_WEIGHTS"),
        ("4", "acme=-1", "LIYAGENT_TENANT_WEIGHTS"),
        ("4", "acme=heavy", "LIYAGENT_TENANT_WEIGHTS"),
        ("4", "acme", "LIYAGENT_TENANT_WEIGHTS"),
        ("4", "=2", "LIYAGENT_TENANT_WEIGHTS"),
        ("4", "acme=inf", "LIYAGENT_TENANT_WEIGHTS"),
    ],
)
def test_a_bad_bound_or_weight_is_refused_naming_the_setting(
    monkeypatch: pytest.MonkeyPatch, in_flight: str, weights: str, named: str
) -> None:
    with pytest.raises(ConfigError, match=named):
        _limits(monkeypatch, in_flight, weights)


def test_the_bounds_travel_to_a_child_process_as_they_were_read(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    limits = _limits(monkeypatch, "3", "acme=2,trial=0.5")
    for name, value in limits.env().items():
        monkeypatch.setenv(name, value)
    assert TenantLimits.from_env() == limits
    assert TenantLimits().env() == {}
