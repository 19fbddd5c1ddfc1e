"""workflow_events: events published to whichever workflows wait for them (`wait_event`), each
taken by every waiting workflow of its name and match; a publisher's key makes a publish
idempotent (issue 36).

Revision ID: 0026_workflow_events
Revises: 0025_on_stop
Create Date: 2026-12-07 21:45:00
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision = "0026_workflow_events"
down_revision = "0025_on_stop"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "workflow_events",
        sa.Column("id", sa.BigInteger, sa.Identity(), primary_key=True),
        sa.Column("name", sa.Text, nullable=False),
        sa.Column("match", sa.Text, nullable=False, server_default=""),
        sa.Column("digest", sa.Text, nullable=False),
        sa.Column("payload", JSONB, nullable=True),
        sa.Column("key", sa.Text, nullable=False),
        sa.Column("sent_by", sa.Text, nullable=False),
        sa.Column("principal", sa.Text, nullable=False, server_default=""),
        sa.Column(
            "created_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.text("now()")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_workflow_events")),
    )
    op.create_index(
        "uq_workflow_events_name_principal_key",
        "workflow_events",
        ["name", "principal", "key"],
        unique=True,
    )
    op.create_index("ix_workflow_events_digest_id", "workflow_events", ["digest", "id"])
    op.create_index("ix_workflow_events_created_at", "workflow_events", ["created_at"])


def downgrade() -> None:
    op.drop_table("workflow_events")
