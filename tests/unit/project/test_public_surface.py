"""What users are shown imports only the public surface: the Python examples of the README and
the docs site's pages (docs/) and the example apps import `liyagent` (the top-level package) and
its framework adapters (`liyagent.adapters.<framework>`), nothing else of ours."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
INTERNALS = {"runtime", "store", "tasks", "front", "simulators", "celeryconfig", "beat_schedule"}


def _ours(source: str) -> set[str]:
    """Modules of ours a piece of Python imports (liyagent's subpackages included)."""
    found = set()
    for node in ast.walk(ast.parse(source)):
        names = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module]
        for name in names:
            top = name.split(".")[0]
            # `liyagent.adapters.<framework>` is public too: each needs its optional extra,
            # so the top-level package cannot import it for the user.
            public = name == "liyagent" or name.startswith("liyagent.adapters.")
            if top in INTERNALS or (top == "liyagent" and not public):
                found.add(name)
    return found


PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def _pages_python() -> list[str]:
    blocks = []
    for page in PAGES:
        text = page.read_text()
        blocks += re.findall(r"```python\n(.*?)```", text, re.S)
        # Python written into files by the pages' shell walkthroughs counts too.
        blocks += re.findall(r"<<'PY'\n(.*?)\nPY\n", text, re.S)
    return blocks


def test_the_pages_examples_import_only_liyagent() -> None:
    blocks = _pages_python()
    assert len(blocks) >= 4
    bad = {name for block in blocks for name in _ours(block)}
    assert bad == set(), f"the pages' examples import internals: {sorted(bad)}"


@pytest.mark.parametrize("path", sorted((ROOT / "examples").rglob("*.py")), ids=lambda p: p.name)
def test_the_example_app_imports_only_liyagent(path: Path) -> None:
    assert _ours(path.read_text()) == set()
