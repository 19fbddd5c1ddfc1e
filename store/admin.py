"""Database administration: creating and dropping whole databases (demo, tests, trials).

Database DDL takes no bind parameters, so names are checked against a strict pattern first.
"""

from __future__ import annotations

import re

import sqlalchemy as sa

from store.errors import LiyagentError

_NAME = re.compile(r"[a-z_][a-z0-9_]{0,62}")


class BadDatabaseName(LiyagentError, ValueError):
    """The name is not a plain lower-case identifier."""


def _checked(name: str) -> str:
    if not _NAME.fullmatch(name):
        raise BadDatabaseName(f"database name {name!r} must match [a-z_][a-z0-9_]*")
    return name


def create_database(admin_url: str, name: str, template: str | None = None) -> None:
    """Create database `name` (optionally as a copy of `template`)."""
    suffix = f" TEMPLATE {_checked(template)}" if template else ""
    _run(admin_url, f"CREATE DATABASE {_checked(name)}{suffix}")


def drop_database(admin_url: str, name: str) -> None:
    """Drop database `name` if it exists, closing its sessions."""
    _run(admin_url, f"DROP DATABASE IF EXISTS {_checked(name)} WITH (FORCE)")


def recreate_database(admin_url: str, name: str) -> None:
    """Drop `name` if it exists and create it empty."""
    drop_database(admin_url, name)
    create_database(admin_url, name)


def _run(admin_url: str, ddl: str) -> None:
    engine = sa.create_engine(admin_url, isolation_level="AUTOCOMMIT", hide_parameters=True)
    try:
        with engine.connect() as conn:
            conn.execute(sa.text(ddl))
    finally:
        engine.dispose()


def database_url(admin_url: str, name: str) -> str:
    """`admin_url` pointing at database `name` instead."""
    return str(
        sa.make_url(admin_url).set(database=_checked(name)).render_as_string(hide_password=False)
    )
