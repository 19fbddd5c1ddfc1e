"""budgets: what a run, an agent or a tenant may spend (issue 34, item 4). A run's budget is two
columns on its row (tokens, US dollars; NULL: none); an agent's or a tenant's per period (day,
month) is a row of `budgets` holding its limits and the period's spend, reserved before each
model request and settled to the response's usage (store/budgets.py). Nullable, no rewrite.

Revision ID: 0021_budgets
Revises: 0020_ledger
Create Date: 2026-12-06 21:00:00
"""

import sqlalchemy as sa
from alembic import op

revision = "0021_budgets"
down_revision = "0020_ledger"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("runs", sa.Column("budget_tokens", sa.BigInteger, nullable=True))
    op.add_column("runs", sa.Column("budget_usd", sa.Numeric(18, 9), nullable=True))
    op.create_table(
        "budgets",
        sa.Column("scope", sa.Text, nullable=False),
        sa.Column("name", sa.Text, nullable=False),
        sa.Column("period", sa.Text, nullable=False),
        sa.Column("tokens", sa.BigInteger, nullable=True),
        sa.Column("usd", sa.Numeric(18, 9), nullable=True),
        sa.Column("period_start", sa.DateTime(timezone=True), nullable=True),
        sa.Column("spent_tokens", sa.BigInteger, nullable=False, server_default="0"),
        sa.Column("spent_usd", sa.Numeric(18, 9), nullable=False, server_default="0"),
        sa.Column(
            "set_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()
        ),
        sa.PrimaryKeyConstraint("scope", "name", "period", name=op.f("pk_budgets")),
        sa.CheckConstraint("scope IN ('agent','tenant')", name=op.f("ck_budgets_scope")),
        sa.CheckConstraint("period IN ('day','month')", name=op.f("ck_budgets_period")),
    )


def downgrade() -> None:
    op.drop_table("budgets")
    op.drop_column("runs", "budget_usd")
    op.drop_column("runs", "budget_tokens")
