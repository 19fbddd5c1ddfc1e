"""on_stop: a Python workflow declared to catch a Stop (`@workflow(catches_stop=True)`) is
started with `compensate`; a Stop turns it into `compensating` and hands it to a new attempt,
which raises `WorkflowStopped` in the function so it can undo what it did (issue 36).

Revision ID: 0025_on_stop
Revises: 0024_signals
Create Date: 2026-12-07 21:30:00
"""

import sqlalchemy as sa
from alembic import op

revision = "0025_on_stop"
down_revision = "0024_signals"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("runs", sa.Column("on_stop", sa.Text, nullable=True))
    op.create_check_constraint(
        "on_stop", "runs", "on_stop IN ('compensate', 'compensating')"
    )


def downgrade() -> None:
    op.drop_column("runs", "on_stop")  # its check constraint goes with it
