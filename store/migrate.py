"""Run Alembic migrations from code (CLI `liyagent db upgrade`, tests, the demo)."""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config

INI = Path(__file__).with_name("alembic.ini")


def config(url: str) -> Config:
    cfg = Config(str(INI))
    cfg.set_main_option("script_location", str(INI.parent / "migrations"))
    cfg.cmd_opts = None
    cfg.attributes["url"] = url
    return cfg


def upgrade(url: str, revision: str = "head") -> None:
    """Migrate the database at `url` to `revision`."""
    cfg = config(url)
    cfg.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    command.upgrade(cfg, revision)
