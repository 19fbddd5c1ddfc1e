"""A user's own modules, written outside the repository where only `sys.path` (this process)
and PYTHONPATH (the processes a test starts) find them, as a team's package would be."""

from __future__ import annotations

import os
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest


def write_module(root: Path, name: str, body: str) -> None:
    (root / f"{name}.py").write_text(textwrap.dedent(body))


def install(stack: Any, home: Path, monkeypatch: pytest.MonkeyPatch, **modules: str) -> None:
    """Write `modules` (name=source) in `home` and name them in LIYAGENT_TOOLS for every
    process started from now on (this one too)."""
    home.mkdir(exist_ok=True)
    for name, source in modules.items():
        write_module(home, name, source)
    monkeypatch.setenv("PYTHONPATH", f"{home}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    monkeypatch.syspath_prepend(str(home))
    stack.reconfigure(tool_modules=tuple(modules))


def importable_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, prefix: str) -> Iterator[Path]:
    """A folder this process imports from; the modules named `prefix...` are forgotten after."""
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path
    for name in [m for m in sys.modules if m.startswith(prefix)]:
        del sys.modules[name]
