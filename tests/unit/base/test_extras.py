"""An optional part's missing SDK is a MissingExtra naming the extra; a missing module of
liyagent's own (a typo, a broken install) is raised as it is, never taken for an extra."""

from __future__ import annotations

import sys
import tomllib
from pathlib import Path

import pytest

from runtime.base.extras import OWN_PACKAGES, MissingExtra, need

ROOT = Path(__file__).resolve().parents[3]


def test_own_packages_are_the_ones_the_distribution_ships() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    include = project["tool"]["setuptools"]["packages"]["find"]["include"]
    assert {name.rstrip("*") for name in include} == OWN_PACKAGES


@pytest.fixture
def modules(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "fake_part_sdk.py").write_text("import liyagent_test_no_such_sdk\n")
    (tmp_path / "fake_part_typo.py").write_text("import front.no_such_module_of_ours\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield
    for name in ("fake_part_sdk", "fake_part_typo"):
        sys.modules.pop(name, None)


@pytest.mark.usefixtures("modules")
def test_a_missing_sdk_is_the_extra_named() -> None:
    with pytest.raises(MissingExtra, match=r"pip install 'liyagent\[a2a\]'") as caught:
        need("a2a", "fake_part_sdk")
    assert caught.value.extra == "a2a"


@pytest.mark.usefixtures("modules")
def test_a_missing_module_of_our_own_is_not_taken_for_an_extra() -> None:
    with pytest.raises(ModuleNotFoundError) as caught:
        need("a2a", "fake_part_typo")
    assert not isinstance(caught.value, MissingExtra)
    assert caught.value.name == "front.no_such_module_of_ours"
    with pytest.raises(ModuleNotFoundError) as missing:
        need("front", "front.no_such_part")
    assert not isinstance(missing.value, MissingExtra)
