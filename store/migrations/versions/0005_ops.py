"""ops: request digests, who lifted a stop

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-01 09:00:00.000000
"""

from alembic import op
import sqlalchemy as sa


revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # What identified the request under its key: the same key with other parameters is refused.
    op.add_column("runs", sa.Column("request_digest", sa.Text(), nullable=True))
    op.add_column("stops", sa.Column("lifted_by", sa.Text(), nullable=True))


def downgrade() -> None:
    op.drop_column("stops", "lifted_by")
    op.drop_column("runs", "request_digest")
