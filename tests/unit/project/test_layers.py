"""The import rules, in their one home: which of our packages may import which, and the order of
`runtime/`'s parts. Read from the source (every import, lazy ones included), so a shortcut taken
inside a function is caught too; and no module of ours, in any package, is on an import circle.
AGENTS.md ("How the code is laid out") says what each part is for; this file says what it may
use."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]

# What each top-level package or module may import of ours (itself always). Bottom to top:
# store <- runtime <- tasks (with the Celery configuration) <- front, liyagent, bench.
LAYERS: dict[str, set[str]] = {
    # All the engine's SQL; knows nothing above it (and no simulator).
    "store": set(),
    # The vendors, model and channels the trials and tests talk to: independent of the engine,
    # so a verdict read from their records is not the engine's belief about itself.
    "simulators": set(),
    # The engine: imports only the store.
    "runtime": {"store"},
    # Celery's configuration and beat's schedule: settings and timings from the engine.
    "beat_schedule": {"runtime"},
    "celeryconfig": {"runtime", "beat_schedule"},
    # Thin Celery glue: ids in, one engine call.
    "tasks": {"store", "runtime", "celeryconfig", "beat_schedule"},
    # The HTTP front: entry points and operator actions over the engine and the glue.
    "front": {"store", "runtime", "tasks"},
    # Public API, CLI, demo and local tooling (which starts the simulators and the front).
    "liyagent": {
        "store",
        "runtime",
        "tasks",
        "front",
        "simulators",
        "celeryconfig",
        "beat_schedule",
    },
    # The bench drives everything, the local tooling included; nothing imports it.
    "bench": {
        "store",
        "runtime",
        "tasks",
        "front",
        "liyagent",
        "simulators",
        "celeryconfig",
        "beat_schedule",
    },
}

# `runtime/`'s parts, bottom to top; a part may import the parts below it, never one above it
# or beside it (sending and durable are peers). `services` is `runtime/services.py`.
RUNTIME_PARTS: list[tuple[str, ...]] = [
    ("base",),
    ("sending", "durable"),
    ("models",),
    ("toolbox",),
    # Framework adapters (Pydantic AI, OpenAI Agents SDK): guests on the toolbox's seam.
    ("frameworks",),
    ("fleet",),
    # Flow control: the order runs are served in (resumed runs first), a model endpoint's gate.
    ("flow",),
    ("services",),
    ("recovery",),
    ("core",),
    ("ops",),
    ("entries",),
]
RANK = {part: rank for rank, parts in enumerate(RUNTIME_PARTS) for part in parts}


def _imports(path: Path) -> set[str]:
    """Every module this file imports, lazily or not (and `pkg.name` for `from pkg import
    name`, which may be a module); relative imports are refused (see the test below)."""
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


def _files(name: str) -> list[Path]:
    if (ROOT / f"{name}.py").is_file():
        return [ROOT / f"{name}.py"]
    return [p for p in (ROOT / name).rglob("*.py") if "migrations/versions" not in str(p)]


def _all_files() -> list[Path]:
    return [path for name in sorted(LAYERS) for path in _files(name)]


def test_every_package_has_a_rule() -> None:
    """A new top-level package or module of the product gets a line in LAYERS (tests, examples
    and the compose checker are not imported by the product)."""
    outside = {"tests", "examples", "compose", "agents", "docs"}
    found = {p.name for p in ROOT.iterdir() if (p / "__init__.py").is_file()}
    found |= {p.stem for p in ROOT.glob("*.py")}
    assert found - outside - set(LAYERS) == set()


def test_no_relative_imports() -> None:
    """The rules read absolute names only, so a relative import would slip past them."""
    bad = [
        str(path.relative_to(ROOT))
        for path in _all_files()
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.ImportFrom) and node.level > 0
    ]
    assert bad == []


@pytest.mark.parametrize("layer", sorted(LAYERS))
def test_layer_imports_only_below(layer: str) -> None:
    bad = []
    for path in _files(layer):
        for name in _imports(path):
            top = name.split(".")[0]
            if top in LAYERS and top != layer and top not in LAYERS[layer]:
                bad.append(f"{path.relative_to(ROOT)} imports {name}")
    assert bad == [], f"{layer} reaches up or sideways:\n" + "\n".join(sorted(bad))


def _part(module: str) -> str | None:
    """The runtime part a module name falls in (None for `runtime` itself, or not runtime)."""
    names = module.split(".")
    return names[1] if names[0] == "runtime" and len(names) > 1 else None


def _runtime_violations() -> dict[tuple[str, str], list[str]]:
    """(importing module, part it reaches) -> the names it imports from that part."""
    found: dict[tuple[str, str], list[str]] = {}
    for path in _files("runtime"):
        importer = _module(path)
        mine = _part(importer)
        if mine is None:
            continue
        for name in sorted(_imports(path)):
            theirs = _part(name)
            if theirs is not None and theirs != mine and RANK[theirs] >= RANK[mine]:
                found.setdefault((importer, theirs), []).append(name)
    return found


def test_runtime_parts_are_named() -> None:
    """Every part of `runtime/` has a place in the order."""
    parts = {_part(_module(p)) for p in _files("runtime")} - {None}
    assert parts - set(RANK) == set()


def test_runtime_parts_import_only_below() -> None:
    found = _runtime_violations()
    bad = sorted(f"{a} imports {names}" for (a, _), names in found.items())
    assert bad == [], "a runtime part reaches up or sideways:\n" + "\n".join(bad)


def test_no_import_circle() -> None:
    """No circle among all our modules, every package included."""
    modules = {_module(p): p for p in _all_files()}
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
