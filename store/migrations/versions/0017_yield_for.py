"""yield for: resumed runs first (issue 33). A loss's claim asks one running first attempt to
yield its slot to the lost run (`runs.yield_for`), read with the gates at its next step
boundary; partial indexes find the youngest running first attempts and the lost runs still
queued without reading every live or queued run.

Revision ID: 0017_yield_for
Revises: 0016_sealed_definitions
Create Date: 2026-12-06 14:30:00
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import UUID

revision = "0017_yield_for"
down_revision = "0016_sealed_definitions"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Nullable, no rewrite: no run is asked to yield until a loss is claimed.
    op.add_column("runs", sa.Column("yield_for", UUID(as_uuid=False), nullable=True))
    op.create_index(
        "ix_runs_first_running",
        "runs",
        ["claimed_at"],
        postgresql_where=sa.text("status = 'running' AND attempt = 1"),
    )
    op.create_index(
        "ix_runs_queued_lost",
        "runs",
        ["id"],
        postgresql_where=sa.text("status = 'queued' AND resume_reason = 'lost'"),
    )


def downgrade() -> None:
    op.drop_index("ix_runs_queued_lost", table_name="runs")
    op.drop_index("ix_runs_first_running", table_name="runs")
    op.drop_column("runs", "yield_for")
