"""The layers point one way: `store/` <- `runtime/` <- `tasks/` <- the public API, CLI, demo,
trials and front. Read from the source (every import, lazy ones included), so a shortcut taken
inside a function is caught too; and `runtime/` has no import circle."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
OURS = {"store", "runtime", "tasks", "liyagent", "front", "simulators", "celeryconfig"}
OURS |= {"beat_schedule"}
# What each layer may import of ours (itself always).
ALLOWED = {
    "store": set(),
    "runtime": {"store"},
    "tasks": {"store", "runtime", "celeryconfig", "beat_schedule"},
    "simulators": set(),
}


def _imports(path: Path) -> set[str]:
    """Every module this file imports, lazily or not (relative imports resolved)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return found


def _module(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _files(package: str) -> list[Path]:
    return [p for p in (ROOT / package).rglob("*.py") if "migrations/versions" not in str(p)]


@pytest.mark.parametrize("layer", sorted(ALLOWED))
def test_layer_imports_only_below(layer: str) -> None:
    bad = []
    for path in _files(layer):
        for name in _imports(path):
            top = name.split(".")[0]
            if top in OURS and top != layer and top not in ALLOWED[layer]:
                bad.append(f"{path.relative_to(ROOT)} imports {name}")
    assert bad == [], f"{layer}/ reaches up or sideways:\n" + "\n".join(sorted(bad))


def test_runtime_has_no_import_circle() -> None:
    modules = {_module(p): p for p in _files("runtime")}
    graph = {
        name: {imported for imported in _imports(path) if imported in modules and imported != name}
        for name, path in modules.items()
    }
    seen: dict[str, int] = {}  # 1 = on the current path, 2 = done

    def visit(node: str, path: list[str]) -> None:
        seen[node] = 1
        for nxt in sorted(graph[node]):
            if seen.get(nxt) == 1:
                cycle = [*path[path.index(nxt) :], nxt]
                raise AssertionError("import circle: " + " -> ".join(cycle))
            if nxt not in seen:
                visit(nxt, [*path, nxt])
        seen[node] = 2

    for name in sorted(graph):
        if name not in seen:
            visit(name, [name])
