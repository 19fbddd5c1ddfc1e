"""The durable tests' fixtures: a stack with the team's own Python workflows installed."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.py_flows import install_flows


@pytest.fixture
def flows(stack, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    install_flows(stack, tmp_path / "acme", monkeypatch)
    return stack
