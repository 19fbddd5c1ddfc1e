"""The front mounts its core always and each entry kind's part that is installed: a part whose
extra is missing is skipped with one log line naming the extra, and nothing of it is mounted."""

from __future__ import annotations

import os
import subprocess
import sys
from importlib import metadata
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest
from starlette.routing import Route
from starlette.testclient import TestClient
from structlog.testing import capture_logs

from front.app import ROUTES, create_app
from front.parts import GROUP, installed
from runtime.base.config import ConfigError
from runtime.base.extras import MissingExtra
from runtime.base.tenancy import TenantLimits
from runtime.services import Services

# Every route the front served before its kinds became parts: (path, methods).
EVERY_ROUTE = {
    ("/healthz", frozenset({"GET", "HEAD"})),
    ("/metrics", frozenset({"GET", "HEAD"})),
    ("/webhooks/{agent}", frozenset({"POST"})),
    ("/tickets/{ticket_id}/events", frozenset({"POST"})),
    ("/events/{name}", frozenset({"POST"})),
    ("/copilot/turns", frozenset({"POST"})),
    ("/.well-known/agent-card.json", frozenset({"GET", "HEAD"})),
    ("/a2a", frozenset({"POST"})),
    ("/api/messages", frozenset({"POST"})),
    ("/approvals/{approval_id}/decision", frozenset({"POST"})),
    ("/runs/{run_id}", frozenset({"GET", "HEAD"})),
    ("/runs/{run_id}/events", frozenset({"GET", "HEAD"})),
    ("/runs/{run_id}/stop", frozenset({"POST"})),
    ("/runs/{run_id}/signal", frozenset({"POST"})),
    ("/runs/{run_id}/stop/lift", frozenset({"POST"})),
    ("/runs/{run_id}/erase", frozenset({"POST"})),
    ("/owners/{owner}/erase", frozenset({"POST"})),
    ("/agents/{agent}/stop", frozenset({"POST"})),
    ("/agents/{agent}/stop/lift", frozenset({"POST"})),
}
OK_PART = """
from starlette.responses import PlainTextResponse
from starlette.routing import Route

from front.parts import FrontPart


async def ok(request):
    return PlainTextResponse(request.app.state.ok)


def setup(app, services):
    app.state.ok = "set up"


PART = FrontPart("ok", [Route("/ok", ok, methods=["GET"])], setup)
"""
# A part whose SDK is not installed: its module's import fails on a package not ours.
SDK_PART = """
import liyagent_test_no_such_sdk

PART = None
"""


def _services(front_parts: tuple[str, ...] = ()) -> Services:
    """Services the core's routes are never asked of here (building the app hands the metrics
    registry its engine, Redis and namespace, and connects to neither)."""
    settings = SimpleNamespace(
        namespace="liyagent-test-parts", tenants=TenantLimits(), front_parts=front_parts
    )
    return cast(Services, SimpleNamespace(engine=None, redis=None, settings=settings))


def _routes(app: Any) -> set[tuple[str, frozenset[str]]]:
    return {(r.path, frozenset(r.methods or ())) for r in app.routes if isinstance(r, Route)}


def _declared(*lines: tuple[str, str]) -> list[metadata.EntryPoint]:
    return [metadata.EntryPoint(name, value, GROUP) for name, value in lines]


@pytest.fixture
def fake_parts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "fake_front_ok.py").write_text(OK_PART)
    (tmp_path / "fake_front_sdk.py").write_text(SDK_PART)
    (tmp_path / "fake_front_wrong.py").write_text("PART = 'not a part'\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield
    for name in ("fake_front_ok", "fake_front_sdk", "fake_front_wrong"):
        sys.modules.pop(name, None)


def test_the_package_lists_each_kinds_part_with_its_extra() -> None:
    listed = {e.name: e for e in metadata.entry_points(group=GROUP)}
    assert {name: e.extras for name, e in listed.items()} == {
        "entries": [],
        "a2a": ["a2a"],
        "teams": ["teams"],
    }
    assert [p.name for p in installed()] == ["a2a", "entries", "teams"]


def test_with_every_part_installed_the_front_serves_every_route() -> None:
    app = create_app(_services())
    assert _routes(app) == EVERY_ROUTE
    assert hasattr(app.state, "a2a") and hasattr(app.state, "teams_keys")


@pytest.mark.usefixtures("fake_parts")
def test_a_part_without_its_extra_is_skipped_with_one_line_and_nothing_mounted() -> None:
    declared = _declared(("sdk", "fake_front_sdk:PART [a2a]"), ("ok", "fake_front_ok:PART"))
    with capture_logs() as lines:
        parts = installed(declared)
    assert [p.name for p in parts] == ["ok"]
    skipped = [x for x in lines if x["event"] == "front.part_skipped"]
    assert [(x["part"], x["extra"], x["log_level"]) for x in skipped] == [("sdk", "a2a", "warning")]
    assert "pip install 'liyagent[a2a]'" in skipped[0]["next"]
    app = create_app(_services(), parts)
    core = {(r.path, frozenset(r.methods or ())) for r in ROUTES}
    assert _routes(app) == core | {("/ok", frozenset({"GET", "HEAD"}))}
    with TestClient(app) as client:
        assert client.get("/ok").text == "set up"


@pytest.mark.usefixtures("fake_parts")
def test_an_entry_point_that_is_no_part_is_a_packaging_error() -> None:
    with pytest.raises(TypeError, match="fake_front_wrong:PART"):
        installed(_declared(("wrong", "fake_front_wrong:PART")))


def test_the_core_alone_mounts_only_the_core() -> None:
    app = create_app(_services(), [])
    assert _routes(app) == {(r.path, frozenset(r.methods or ())) for r in ROUTES}
    assert not hasattr(app.state, "a2a") and not hasattr(app.state, "teams_keys")


@pytest.mark.usefixtures("fake_parts")
def test_a_deployment_that_names_its_parts_gets_those_alone() -> None:
    declared = _declared(("sdk", "fake_front_sdk:PART [a2a]"), ("ok", "fake_front_ok:PART"))
    assert [p.name for p in installed(declared, demanded=("ok",))] == ["ok"]
    app = create_app(_services(front_parts=("teams",)))
    assert ("/api/messages", frozenset({"POST"})) in _routes(app)
    assert ("/a2a", frozenset({"POST"})) not in _routes(app)


@pytest.mark.usefixtures("fake_parts")
def test_a_demanded_part_that_cannot_be_served_is_refused_not_skipped() -> None:
    declared = _declared(("sdk", "fake_front_sdk:PART [a2a]"), ("ok", "fake_front_ok:PART"))
    with pytest.raises(MissingExtra, match=r"pip install 'liyagent\[a2a\]'"):
        installed(declared, demanded=("sdk", "ok"))
    with pytest.raises(ConfigError, match=r"FRONT_PARTS names tems, .*the parts are: ok, sdk"):
        installed(declared, demanded=("tems",))


def test_the_front_refuses_to_start_without_a_demanded_part() -> None:
    env = {**os.environ, "LIYAGENT_FRONT_PARTS": "teams,tems", "LIYAGENT_LOG_FORMAT": "json"}
    done = subprocess.run(
        [sys.executable, "-m", "liyagent", "serve", "--port", "0"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2, done
    refused = [line for line in done.stderr.splitlines() if "front.bad_settings" in line]
    assert len(refused) == 1 and "LIYAGENT_FRONT_PARTS names tems" in refused[0], done.stderr
    assert "Traceback" not in done.stderr
