"""Each entry kind has exactly one entry point with its whole policy, registered explicitly (the
`liyagent.entries` entry-point group, never an import's side effect), and the core that looks
them up names none of them (it imports nothing of `runtime/entries/` and keeps no list of
kinds)."""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path
from types import SimpleNamespace

from runtime.core.entry import GROUP, EntryPoint, Policy, entry_point, registered_kinds
from store.entries import EntryKind

ROOT = Path(__file__).resolve().parents[3]


def _point(kind: str) -> EntryPoint:
    """The entry point of a run of `kind` (only its id and kind are read)."""
    return entry_point(SimpleNamespace(id="r", entry_kind=kind))


# Every kind this package installs: the core's own (`EntryKind`) and its entry points' names.
KINDS = {*EntryKind, "webhook", "ticket_event", "copilot", "cron", "a2a", "teams"}


def test_every_kind_has_its_entry_point_and_only_teams_hands_on_outside() -> None:
    assert registered_kinds() == KINDS
    for kind in KINDS:
        assert kind in _point(kind).kinds, kind
    outside = {kind for kind in KINDS if _point(kind).outside}
    assert outside == {"teams"}


def test_only_teams_has_settings_of_its_own_and_they_are_no_part_of_the_base() -> None:
    from runtime.base.settings import Settings
    from runtime.entries.teams.settings import TeamsSettings

    typed = {kind: _point(kind).settings_type for kind in KINDS if _point(kind).settings_type}
    assert typed == {"teams": TeamsSettings}
    assert not [f for f in Settings.__dataclass_fields__ if f.startswith("teams")]


def test_a_kind_an_app_names_itself_is_the_client_apis() -> None:
    assert _point("my-app-kind") is _point(EntryKind.PLAIN)


def test_each_entry_module_registers_its_own_kinds() -> None:
    modules = {
        "client": {"plain", "managed", "playground", "resume"},
        "webhook": {"webhook"},
        "ticket_event": {"ticket_event"},
        "copilot": {"copilot"},
        "cron": {"cron"},
        "a2a": {"a2a"},
        "teams.reply": {"teams"},
    }
    for name, kinds in modules.items():
        module = __import__(f"runtime.entries.{name}", fromlist=["ENTRY"])
        assert module.ENTRY.kinds == kinds, name
        assert all(_point(kind) is module.ENTRY for kind in kinds), name


def test_the_core_imports_no_entry_module() -> None:
    bad = []
    for path in (ROOT / "runtime" / "core").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            bad += [f"{path.name}: {n}" for n in names if n.startswith("runtime.entries")]
    assert bad == []


def test_each_kinds_policy_is_its_entry_points() -> None:
    """What the core used to keep as lists of kinds, each entry point now says of its own."""
    waits = {k for k in KINDS if _point(k).policy.may_wait}
    from_catalog = {k for k in KINDS if _point(k).policy.from_catalog}
    by_setting = {k for k in KINDS if _point(k).policy.written_ahead_by_setting}
    K = EntryKind
    assert waits == {K.PLAIN, K.MANAGED, K.PLAYGROUND, K.RESUME, "a2a", K.DELEGATION, K.JOB}
    assert by_setting == {"cron", "webhook", "ticket_event", "copilot", "teams"}
    assert from_catalog == by_setting | {"a2a"}
    assert _point(K.PLAIN).policy == Policy(may_wait=True)


def test_entry_points_are_registered_in_the_package_metadata_not_by_import() -> None:
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["entry-points"]
    modules = {v.split(":")[0] for v in declared[GROUP].values()}
    assert modules == {
        f"runtime.entries.{m}"
        for m in ("client", "webhook", "ticket_event", "copilot", "cron", "a2a", "teams.reply")
    }
    init = ast.parse((ROOT / "runtime" / "entries" / "__init__.py").read_text())
    assert not any(isinstance(node, ast.Import | ast.ImportFrom) for node in init.body)


def test_the_core_names_no_entry_kind_but_its_own() -> None:
    """The core's own kinds (delegation, job) only, and the default a run started without one
    has (`plain`, the client API's, which a kind an app names itself falls back to): every other
    is an entry point's to say."""
    named = []
    for path in (ROOT / "runtime" / "core").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Name)
                and node.value.id in ("EntryKind", "K")
                and node.attr not in ("DELEGATION", "JOB", "PLAIN")
            ):
                named.append(f"{path.name}: {node.value.id}.{node.attr}")
    assert named == []
