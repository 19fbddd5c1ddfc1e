"""signals: messages sent to a run, each taken once by a workflow's step or an agent's next
step boundary; a sender's key makes a send idempotent (issue 36).

Revision ID: 0024_signals
Revises: 0023_code_versions
Create Date: 2026-12-07 17:10:00
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB, UUID

revision = "0024_signals"
down_revision = "0023_code_versions"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "signals",
        sa.Column("id", sa.BigInteger, sa.Identity(), primary_key=True),
        sa.Column(
            "run_id",
            UUID(as_uuid=False),
            sa.ForeignKey("runs.id", name=op.f("fk_signals_run_id_runs"), ondelete="CASCADE"),
            nullable=False,
        ),
        sa.Column("name", sa.Text, nullable=False),
        sa.Column("payload", JSONB, nullable=True),
        sa.Column("key", sa.Text, nullable=False),
        sa.Column("sent_by", sa.Text, nullable=False),
        sa.Column(
            "created_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.text("now()")
        ),
        sa.Column("taken_by", sa.Text, nullable=True),
        sa.Column("taken_at", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_signals")),
    )
    op.create_index("uq_signals_run_id_key", "signals", ["run_id", "key"], unique=True)
    op.create_index("ix_signals_run_id_name", "signals", ["run_id", "name"])


def downgrade() -> None:
    op.drop_table("signals")
