"""ledger: what each written step cost (cost_usd, from the deployment's price table at the time
it was written; NULL for a model no entry prices), on the row the step is written in, and what a
lost attempt was reserved for a step it never wrote (usage_unconfirmed), recorded by the claim
of its loss (issue 34). Nullable, no rewrite: a step written before has no cost recorded.

Revision ID: 0020_ledger
Revises: 0019_step_usage
Create Date: 2026-12-06 21:00:00
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import UUID

revision = "0020_ledger"
down_revision = "0019_step_usage"
branch_labels = None
depends_on = None

_COST = sa.Numeric(18, 9)


def upgrade() -> None:
    op.add_column("run_steps", sa.Column("cost_usd", _COST, nullable=True))
    op.add_column("runs", sa.Column("answer_cost_usd", _COST, nullable=True))
    op.create_table(
        "usage_unconfirmed",
        sa.Column(
            "run_id",
            UUID(as_uuid=False),
            sa.ForeignKey(
                "runs.id", ondelete="CASCADE", name="fk_usage_unconfirmed_run_id_runs"
            ),
            nullable=False,
        ),
        sa.Column("attempt", sa.Integer, nullable=False),
        sa.Column("step", sa.Integer, nullable=False),
        sa.Column("input_tokens", sa.Integer, nullable=False),
        sa.Column("output_tokens", sa.Integer, nullable=False),
        sa.Column("model", sa.Text, nullable=True),
        sa.Column("cost_usd", _COST, nullable=True),
        sa.Column(
            "recorded_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.text("now()")
        ),
        sa.PrimaryKeyConstraint("run_id", "attempt", "step", name="pk_usage_unconfirmed"),
    )
    op.create_index("ix_usage_unconfirmed_recorded_at", "usage_unconfirmed", ["recorded_at"])


def downgrade() -> None:
    op.drop_index("ix_usage_unconfirmed_recorded_at", table_name="usage_unconfirmed")
    op.drop_table("usage_unconfirmed")
    op.drop_column("runs", "answer_cost_usd")
    op.drop_column("run_steps", "cost_usd")
