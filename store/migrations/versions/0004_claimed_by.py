"""claimed by

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-30 04:23:17.237927
"""

from alembic import op
import sqlalchemy as sa


revision = '0004'
down_revision = '0003'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column('runs', sa.Column('claimed_by', sa.Text(), nullable=True))
    op.add_column('runs', sa.Column('claimed_at', sa.DateTime(timezone=True), nullable=True))


def downgrade() -> None:
    op.drop_column('runs', 'claimed_at')
    op.drop_column('runs', 'claimed_by')
