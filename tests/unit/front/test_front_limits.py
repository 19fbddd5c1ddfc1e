"""The front's limits: its settings refuse nonsense by name, the connection cap and the accept
round are fitted under the file descriptor limit, and that limit is raised to the hard one."""

from __future__ import annotations

import subprocess
import sys

import pytest

from front.limits import RESERVED_FDS, ROUNDS_IN_FLIGHT, FrontLimits
from liyagent.local.procs import ROOT
from runtime.base.settings import ConfigError


def test_defaults_fit_a_generous_limit_and_shrink_under_a_small_one() -> None:
    assert FrontLimits().fitted(1 << 20) == FrontLimits()
    for fd_limit in (256, 1024, 4096):
        fitted = FrontLimits().fitted(fd_limit)
        in_use = fitted.max_connections + ROUNDS_IN_FLIGHT * fitted.accept_batch + RESERVED_FDS
        assert in_use <= fd_limit, (fd_limit, fitted)
        assert fitted.backlog == 2048  # queued connections hold no descriptor
    assert FrontLimits().fitted(256).max_connections == 96
    with pytest.raises(ConfigError, match="ulimit -n"):
        FrontLimits().fitted(70)


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("LIYAGENT_FRONT_HEAD_TIMEOUT_S", "0"),
        ("LIYAGENT_FRONT_HEAD_TIMEOUT_S", "soon"),
        ("LIYAGENT_FRONT_BODY_TIMEOUT_S", "-1"),
        ("LIYAGENT_FRONT_REFUSAL_LOG_S", "nan"),
        ("LIYAGENT_FRONT_MAX_CONNECTIONS", "0"),
        ("LIYAGENT_FRONT_MAX_CONNECTIONS", "1e3"),
        ("LIYAGENT_FRONT_BACKLOG", "-5"),
    ],
)
def test_bad_settings_are_refused_by_name(monkeypatch, name: str, value: str) -> None:
    monkeypatch.setenv(name, value)
    with pytest.raises(ConfigError, match=name):
        FrontLimits.from_env()


def test_settings_are_read(monkeypatch) -> None:
    monkeypatch.setenv("LIYAGENT_FRONT_HEAD_TIMEOUT_S", "2.5")
    monkeypatch.setenv("LIYAGENT_FRONT_MAX_CONNECTIONS", "300")
    limits = FrontLimits.from_env()
    assert (limits.head_timeout_s, limits.max_connections) == (2.5, 300)
    assert limits.body_timeout_s == FrontLimits.body_timeout_s


def test_the_descriptor_limit_is_raised_to_the_hard_one() -> None:
    code = (
        "import resource; from front.limits import raise_fd_limit; "
        "resource.setrlimit(resource.RLIMIT_NOFILE, (300, 900)); "
        "print(raise_fd_limit(), resource.getrlimit(resource.RLIMIT_NOFILE))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert out.stdout.split(maxsplit=1) == ["900", "(900, 900)\n"]
