"""event marks: a marked call keeps when and by which attempt it was first marked, so its
`call_marked` run event stays where it was once a resume marks it again (a keyed write sent
again with its key moves `marked_at` and `attempt`, which settlement reads)

Revision ID: 0013_event_marks
Revises: step_records
Create Date: 2026-12-02 07:10:00
"""

from alembic import op
import sqlalchemy as sa


revision = "0013_event_marks"
down_revision = "step_records"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Nullable, no rewrite of the table: a mark written before keeps NULL and its events read
    # `attempt` and `marked_at` instead (store/events.py).
    op.add_column("call_marks", sa.Column("first_attempt", sa.Integer(), nullable=True))
    op.add_column(
        "call_marks", sa.Column("first_marked_at", sa.DateTime(timezone=True), nullable=True)
    )


def downgrade() -> None:
    op.drop_column("call_marks", "first_marked_at")
    op.drop_column("call_marks", "first_attempt")
