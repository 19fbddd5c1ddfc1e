"""The one SQLAlchemy `MetaData` the tables of `store/schema/` are declared on, its naming
convention, and what their definitions share."""

from __future__ import annotations

import sqlalchemy as sa

from store.states import MarkStatus, RunStatus

NAMING = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

metadata = sa.MetaData(naming_convention=NAMING)

RUN_STATUSES = tuple(s.value for s in RunStatus)
CALL_STATUSES = tuple(s.value for s in MarkStatus)


def now() -> sa.TextClause:
    """A column's default: the server's clock at insert."""
    return sa.text("now()")
