"""Each entry kind has exactly one entry point, registered by its module of `runtime/entries/`,
and the core that looks them up names none of them (it imports nothing of `runtime/entries/`)."""

from __future__ import annotations

import ast
from pathlib import Path
from types import SimpleNamespace

import runtime.entries  # noqa: F401  (registers every kind)
from runtime.core.entry import EntryPoint, entry_point
from store.entries import EntryKind

ROOT = Path(__file__).resolve().parents[2]


def _point(kind: str) -> EntryPoint:
    """The entry point of a run of `kind` (only its id and kind are read)."""
    return entry_point(SimpleNamespace(id="r", entry_kind=kind))


def test_every_kind_has_its_entry_point_and_only_teams_hands_on_outside() -> None:
    for kind in EntryKind:
        assert kind in _point(kind).kinds, kind
    outside = {kind for kind in EntryKind if _point(kind).outside}
    assert outside == {EntryKind.TEAMS}


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
        "teams": {"teams"},
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
