"""pins: what of the code a run was started against (issue 35, item 1), sealed in a column of
its own so a worker of before it reads the run's definition as it always did, and since when a
run has waited for a worker whose code serves its pin (NULL: it does not wait). Nullable, no
rewrite.

Revision ID: 0022_pins
Revises: 0021_budgets
Create Date: 2026-12-07 07:00:00
"""

import sqlalchemy as sa
from alembic import op

revision = "0022_pins"
down_revision = "0021_budgets"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("runs", sa.Column("pin", sa.LargeBinary, nullable=True))
    op.add_column("runs", sa.Column("drift_since", sa.DateTime(timezone=True), nullable=True))


def downgrade() -> None:
    op.drop_column("runs", "drift_since")
    op.drop_column("runs", "pin")
