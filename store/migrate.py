"""Run Alembic migrations from code (CLI `liyagent db upgrade`, tests, the demo)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from alembic import command
from alembic.config import Config

INI = Path(__file__).with_name("alembic.ini")


def config(url: str) -> Config:
    cfg = Config(str(INI))
    cfg.set_main_option("script_location", str(INI.parent / "migrations"))
    cfg.cmd_opts = None
    cfg.attributes["url"] = url
    return cfg


def upgrade(
    url: str,
    revision: str = "head",
    seal_definition: Callable[[Mapping[str, Any]], bytes] | None = None,
) -> None:
    """Migrate the database at `url` to `revision`. `seal_definition` seals an unfinished run's
    definition from its old plain spec (migration 0016, which refuses without it when such
    runs exist): the store holds no keys, the caller's runtime does."""
    cfg = config(url)
    cfg.attributes["seal_definition"] = seal_definition
    cfg.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    command.upgrade(cfg, revision)
