"""Migrations: one head, and upgrading a fresh database to it gives exactly the models."""

from __future__ import annotations

import uuid

import sqlalchemy as sa
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from alembic.script import ScriptDirectory

from store import migrate
from store.schema import metadata


def test_single_head() -> None:
    script = ScriptDirectory.from_config(migrate.config("postgresql://unused"))
    assert len(script.get_heads()) == 1


def test_upgrade_to_head_matches_the_models(admin_engine, servers) -> None:
    name = f"lyt_mig_{uuid.uuid4().hex[:12]}"
    with admin_engine.connect() as conn:
        conn.execute(sa.text(f"CREATE DATABASE {name}"))
    url = sa.make_url(servers[0]).set(database=name).render_as_string(hide_password=False)
    try:
        migrate.upgrade(url)
        engine = sa.create_engine(url)
        with engine.connect() as conn:
            diff = compare_metadata(MigrationContext.configure(conn), metadata)
        assert diff == []
        cfg = migrate.config(url)
        cfg.set_main_option("sqlalchemy.url", url)
        command.downgrade(cfg, "base")
        migrate.upgrade(url)
        engine.dispose()
    finally:
        with admin_engine.connect() as conn:
            conn.execute(sa.text(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
