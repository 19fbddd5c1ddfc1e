"""What runs spend: a lost attempt's unconfirmed usage and the budgets of agents and tenants
(the usage of written steps is on their step rows, `store/usage.py`)."""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import UUID

from store.schema.base import metadata, now

usage_unconfirmed = sa.Table(
    "usage_unconfirmed",
    metadata,
    # What a lost attempt was reserved for a step it never wrote (store/ledger.py): its input
    # bound, its max_tokens and model, noted in Redis before the request, recorded by the claim
    # of its loss in the claim's own statement; apart from the exact usage of written steps.
    sa.Column("run_id", UUID(as_uuid=False), sa.ForeignKey("runs.id", ondelete="CASCADE")),
    sa.Column("attempt", sa.Integer, nullable=False),
    sa.Column("step", sa.Integer, nullable=False),
    sa.Column("input_tokens", sa.Integer, nullable=False),
    sa.Column("output_tokens", sa.Integer, nullable=False),
    sa.Column("model", sa.Text, nullable=True),
    sa.Column("cost_usd", sa.Numeric(18, 9), nullable=True),
    sa.Column("recorded_at", sa.DateTime(timezone=True), nullable=False, server_default=now()),
    sa.PrimaryKeyConstraint("run_id", "attempt", "step"),
    sa.Index("ix_usage_unconfirmed_recorded_at", "recorded_at"),
)

# What an agent's or a tenant's runs may spend a period (day, month, UTC), and the period's spend
# so far (reserved before each request, settled to its usage): store/budgets.py.
budgets = sa.Table(
    "budgets",
    metadata,
    sa.Column("scope", sa.Text, nullable=False),
    sa.Column("name", sa.Text, nullable=False),
    sa.Column("period", sa.Text, nullable=False),
    sa.Column("tokens", sa.BigInteger, nullable=True),
    sa.Column("usd", sa.Numeric(18, 9), nullable=True),
    sa.Column("period_start", sa.DateTime(timezone=True), nullable=True),
    sa.Column("spent_tokens", sa.BigInteger, nullable=False, server_default="0"),
    sa.Column("spent_usd", sa.Numeric(18, 9), nullable=False, server_default="0"),
    # When its limits were last set: a run that waits on it since before is woken (wake_ready).
    sa.Column("set_at", sa.DateTime(timezone=True), nullable=False, server_default=now()),
    sa.PrimaryKeyConstraint("scope", "name", "period"),
    sa.CheckConstraint("scope IN ('agent','tenant')", name="scope"),
    sa.CheckConstraint("period IN ('day','month')", name="period"),
)
