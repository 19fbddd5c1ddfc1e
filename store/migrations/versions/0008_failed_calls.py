"""failed calls: a marked call whose tool raised before any request of it left is recorded
`failed` (nothing was sent), not left in doubt

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-01 21:00:00
"""

from alembic import op


revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.drop_constraint(op.f("ck_call_marks_status"), "call_marks", type_="check")
    op.create_check_constraint(
        op.f("ck_call_marks_status"),
        "call_marks",
        "status IN ('in_doubt','done','settled','failed')",
    )


def downgrade() -> None:
    # A failed call sent nothing: as a settled one it is still never sent again.
    op.execute("UPDATE call_marks SET status = 'settled' WHERE status = 'failed'")
    op.drop_constraint(op.f("ck_call_marks_status"), "call_marks", type_="check")
    op.create_check_constraint(
        op.f("ck_call_marks_status"), "call_marks", "status IN ('in_doubt','done','settled')"
    )
