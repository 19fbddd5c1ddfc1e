"""`source_sync`'s `dir:` sources are confined to the roots the deployment names
(LIYAGENT_SOURCE_ROOTS): none named refuses them all; a path is judged after its symlinks and
`..` are resolved; the setting itself is refused at start when a root is not absolute."""

from __future__ import annotations

from pathlib import Path

import pytest

from liyagent.jobs import KINDS as JOB_KINDS
from runtime.base.settings import ConfigError, Settings, get_settings
from runtime.toolbox.job_kinds import JobError


def check(source: str, *roots: str) -> None:
    JOB_KINDS["source_sync"].check({"source": source}, Settings(source_roots=roots))


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """root/docs (allowed), secret/ beside it (not), and links from inside root to each."""
    (tmp_path / "root" / "docs").mkdir(parents=True)
    (tmp_path / "secret").mkdir()
    (tmp_path / "root" / "out").symlink_to(tmp_path / "secret")
    (tmp_path / "root" / "in").symlink_to(tmp_path / "root" / "docs")
    return tmp_path


def test_with_no_roots_every_dir_source_is_refused_naming_the_setting(tree: Path) -> None:
    with pytest.raises(JobError) as refused:
        check(f"dir:{tree / 'root' / 'docs'}")
    assert "LIYAGENT_SOURCE_ROOTS names no directory" in str(refused.value)


def test_the_process_settings_stand_when_none_are_handed(
    tree: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    get_settings.cache_clear()
    monkeypatch.delenv("LIYAGENT_SOURCE_ROOTS", raising=False)
    try:
        with pytest.raises(JobError, match="LIYAGENT_SOURCE_ROOTS"):
            JOB_KINDS["source_sync"].check({"source": "dir:/etc"})
        monkeypatch.setenv("LIYAGENT_SOURCE_ROOTS", str(tree / "root"))
        get_settings.cache_clear()
        JOB_KINDS["source_sync"].check({"source": f"dir:{tree / 'root' / 'docs'}"})
    finally:
        get_settings.cache_clear()


@pytest.mark.parametrize("inside", ["root", "root/docs", "root/in", "root/docs/../docs"])
def test_a_root_and_what_is_under_it_pass(tree: Path, inside: str) -> None:
    check(f"dir:{tree / inside}", str(tree / "root"))


@pytest.mark.parametrize(
    "outside",
    [
        "secret",
        "root/out",  # a link inside the root to a directory outside it
        "root/../secret",
        "root/docs/../../secret",
        "rootless",  # a sibling whose name starts like the root's
    ],
)
def test_a_path_outside_the_roots_is_refused_after_resolving(tree: Path, outside: str) -> None:
    with pytest.raises(JobError) as refused:
        check(f"dir:{tree / outside}", str(tree / "root"))
    assert "must be one of the directories LIYAGENT_SOURCE_ROOTS names" in str(refused.value)


def test_a_root_named_through_a_link_is_resolved_too(tree: Path) -> None:
    (tree / "alias").symlink_to(tree / "root")
    check(f"dir:{tree / 'root' / 'docs'}", str(tree / "alias"))
    with pytest.raises(JobError):
        check(f"dir:{tree / 'secret'}", str(tree / "alias"))


def test_a_relative_source_is_refused(tree: Path) -> None:
    with pytest.raises(JobError, match="absolute path"):
        check("dir:docs", str(tree / "root"))


def test_a_relative_root_is_refused_at_start(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LIYAGENT_SOURCE_ROOTS", "/srv/docs,notes")
    with pytest.raises(ConfigError, match="LIYAGENT_SOURCE_ROOTS: 'notes' is not an absolute"):
        Settings.from_env()
    monkeypatch.setenv("LIYAGENT_SOURCE_ROOTS", " /srv/docs , /data/notes ")
    assert Settings.from_env().source_roots == ("/srv/docs", "/data/notes")
