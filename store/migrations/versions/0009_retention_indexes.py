"""retention indexes: finished runs by finish time, audit rows by age, teams rows and stops by
run, so each retention batch finds its oldest rows and their dependents without a scan

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-01 21:15:00
"""

from alembic import op
import sqlalchemy as sa


revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index(
        "ix_runs_finished_at",
        "runs",
        ["finished_at", "id"],
        postgresql_where=sa.text("status IN ('succeeded','failed')"),
    )
    op.create_index("ix_audit_events_created_at", "audit_events", ["created_at", "id"])
    op.create_index("ix_stops_run_id_all", "stops", ["run_id"])


def downgrade() -> None:
    op.drop_index("ix_stops_run_id_all", table_name="stops")
    op.drop_index("ix_audit_events_created_at", table_name="audit_events")
    op.drop_index("ix_runs_finished_at", table_name="runs")
