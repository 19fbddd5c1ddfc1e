"""code_versions: each version of the deployment's code (what its tool modules declare, as a
whole) and when the fleet first saw it, so a run that follows the latest definition is re-pinned
only forward: a worker of older code than the one it follows hands it back (issue 35). Small:
one row per deploy.

Revision ID: 0023_code_versions
Revises: 0022_pins
Create Date: 2026-12-07 10:10:00
"""

import sqlalchemy as sa
from alembic import op

revision = "0023_code_versions"
down_revision = "0022_pins"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "code_versions",
        sa.Column("id", sa.Text, primary_key=True),
        sa.Column(
            "first_seen", sa.DateTime(timezone=True), nullable=False, server_default=sa.text("now()")
        ),
    )


def downgrade() -> None:
    op.drop_table("code_versions")
