"""tenants and priorities: flow control for the fleet (issue 33). A run carries its tenant (its
owner unless the caller names one) and a priority (1 low, 2 normal, 3 high); a deployment that
bounds each tenant's runs in flight holds a new run past its tenant's bound as waiting on
`tenant`, admitted in priority order as the tenant's runs end (runtime/flow/tenants.py).
Partial indexes count a tenant's live runs and find its held ones without reading the table.

Revision ID: 0018_tenants
Revises: 0017_yield_for
Create Date: 2026-12-06 17:40:00
"""

import sqlalchemy as sa
from alembic import op

revision = "0018_tenants"
down_revision = "0017_yield_for"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Nullable, no rewrite: a run stored before tenants existed counts as no tenant's.
    op.add_column("runs", sa.Column("tenant", sa.Text, nullable=True))
    # A constant default: no rewrite either (Postgres >= 11).
    op.add_column(
        "runs", sa.Column("priority", sa.SmallInteger, nullable=False, server_default="2")
    )
    op.create_check_constraint(op.f("ck_runs_priority"), "runs", "priority BETWEEN 1 AND 3")
    op.create_index(
        "ix_runs_tenant_live",
        "runs",
        ["tenant"],
        postgresql_where=sa.text(
            "status IN ('queued','running','answered') "
            "OR (status = 'waiting' AND waiting_on LIKE 'model:%')"
        ),
    )
    op.create_index(
        "ix_runs_tenant_held",
        "runs",
        ["tenant", sa.text("priority DESC"), "queued_at"],
        postgresql_where=sa.text("status = 'waiting' AND waiting_on = 'tenant'"),
    )


def downgrade() -> None:
    op.drop_index("ix_runs_tenant_held", table_name="runs")
    op.drop_index("ix_runs_tenant_live", table_name="runs")
    op.drop_constraint(op.f("ck_runs_priority"), "runs", type_="check")
    op.drop_column("runs", "priority")
    op.drop_column("runs", "tenant")
