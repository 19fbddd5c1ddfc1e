"""A command imports only what it needs: `import liyagent` imports nothing of the engine, a
team's tool module pays for the tool declarations only, and `liyagent --help` imports no
command. Proved structurally, from the modules a fresh interpreter holds as it exits, never by
timing (the figures are in the report of issue 31, not asserted here).
tests/integration/cli/test_cli_reads.py holds `status` and `inspect` to the same rule."""

from __future__ import annotations

import argparse
import importlib

import pytest

import liyagent
from liyagent.cli import main as cli_main
from tests.support.imports import BASE, ENGINE, HEAVY, imported, tops


def test_import_liyagent_imports_nothing_of_the_engine() -> None:
    found = tops(imported("-c", "import liyagent"))
    assert found & (ENGINE | HEAVY | BASE) == set()


def test_a_tool_module_imports_no_client_celery_or_database() -> None:
    found = imported("-c", "from liyagent import CallContext, tool, agent, job")
    assert tops(found) & (HEAVY | {"tasks", "front", "sqlalchemy", "psycopg", "redis"}) == set()
    assert "runtime.services" not in found and "runtime.entries.client" not in found


def test_help_imports_no_command() -> None:
    found = imported("--help")
    assert tops(found) & (ENGINE | HEAVY | BASE) == set()
    assert {m for m in found if m.startswith("liyagent.")} == {
        "liyagent.cli",
        "liyagent.cli.common",
        "liyagent.cli.main",
        "liyagent.own_modules",
    }


def test_a_commands_help_imports_that_command_only() -> None:
    found = imported("keys", "--help")
    assert {m for m in found if m.startswith("liyagent.cli.")} == {
        "liyagent.cli.admin",
        "liyagent.cli.common",
        "liyagent.cli.main",
    }
    assert tops(found) & (ENGINE | HEAVY | BASE) == set()


def test_every_command_has_its_options_where_the_table_says() -> None:
    """The whole parser (every command module imported) builds, and each command's options
    come from the module the table names."""
    parser = cli_main.build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    assert list(sub.choices) == [c.name for c in cli_main.COMMANDS]
    for command in cli_main.COMMANDS:
        if not command.passthrough:
            assert command.name in importlib.import_module(command.module).ARGUMENTS


@pytest.mark.parametrize(
    "kind", [*cli_main._USAGE, *cli_main._REDIS_DOWN], ids=lambda k: f"{k[0]}.{k[1]}"
)
def test_every_error_the_cli_tells_is_an_exception_class(kind: tuple[str, str]) -> None:
    found = getattr(importlib.import_module(kind[0]), kind[1])
    assert isinstance(found, type) and issubclass(found, Exception)


def test_every_public_name_resolves_from_its_home() -> None:
    for name in liyagent.__all__:
        assert getattr(liyagent, name) is not None, name
    assert set(liyagent._HOMES) <= set(liyagent.__all__)
    assert liyagent.BadRequest is importlib.import_module("runtime.entries.client").BadRequest
    with pytest.raises(AttributeError, match="no attribute 'tol'"):
        liyagent.tol  # type: ignore[attr-defined]  # noqa: B018
