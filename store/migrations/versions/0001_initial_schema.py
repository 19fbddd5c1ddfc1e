"""initial schema

Revision ID: 0001
Revises:
Create Date: 2026-11-30 03:36:55.042793
"""

from alembic import op
import sqlalchemy as sa
from sqlalchemy.dialects import postgresql

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "audit_events",
        sa.Column("id", sa.BigInteger(), sa.Identity(always=False), nullable=False),
        sa.Column("run_id", sa.UUID(as_uuid=False), nullable=True),
        sa.Column("kind", sa.Text(), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=True),
        sa.Column("step", sa.Integer(), nullable=True),
        sa.Column(
            "detail",
            postgresql.JSONB(astext_type=sa.Text()),
            server_default=sa.text("'{}'::jsonb"),
            nullable=False,
        ),
        sa.Column(
            "created_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_audit_events")),
    )
    op.create_index("ix_audit_events_kind", "audit_events", ["kind"], unique=False)
    op.create_index("ix_audit_events_run_id", "audit_events", ["run_id"], unique=False)
    op.create_table(
        "model_requests",
        sa.Column("id", sa.BigInteger(), sa.Identity(always=False), nullable=False),
        sa.Column("run_id", sa.UUID(as_uuid=False), nullable=False),
        sa.Column("step", sa.Integer(), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("provider", sa.Text(), nullable=False),
        sa.Column(
            "tool_results",
            postgresql.JSONB(astext_type=sa.Text()),
            server_default=sa.text("'[]'::jsonb"),
            nullable=False,
        ),
        sa.Column(
            "created_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_model_requests")),
    )
    op.create_index("ix_model_requests_run_id", "model_requests", ["run_id", "step"], unique=False)
    op.create_table(
        "runs",
        sa.Column("id", sa.UUID(as_uuid=False), nullable=False),
        sa.Column("correlation_id", sa.Text(), nullable=False),
        sa.Column("request_key", sa.Text(), nullable=True),
        sa.Column("agent", sa.Text(), nullable=False),
        sa.Column("owner", sa.Text(), nullable=False),
        sa.Column("entry_kind", sa.Text(), server_default="plain", nullable=False),
        sa.Column("spec", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.Column("status", sa.Text(), server_default="queued", nullable=False),
        sa.Column("attempt", sa.Integer(), server_default="1", nullable=False),
        sa.Column("lost_count", sa.Integer(), server_default="0", nullable=False),
        sa.Column("deliveries", sa.Integer(), server_default="0", nullable=False),
        sa.Column("step", sa.Integer(), server_default="0", nullable=False),
        sa.Column("resume_reason", sa.Text(), nullable=True),
        sa.Column("failure_reason", sa.Text(), nullable=True),
        sa.Column("answer", sa.LargeBinary(), nullable=True),
        sa.Column(
            "created_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.Column(
            "updated_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.Column(
            "queued_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=True
        ),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("answered_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.CheckConstraint(
            "status IN ('queued','running','waiting','answered','succeeded','failed')",
            name=op.f("ck_runs_status"),
        ),
        sa.CheckConstraint("attempt >= 1", name=op.f("ck_runs_attempt_positive")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_runs")),
    )
    op.create_index(
        "ix_runs_live",
        "runs",
        ["id"],
        unique=False,
        postgresql_where=sa.text("status IN ('running','answered')"),
    )
    op.create_index(
        "ix_runs_queued_at",
        "runs",
        ["queued_at"],
        unique=False,
        postgresql_where=sa.text("status = 'queued'"),
    )
    op.create_index(
        "uq_runs_request_key",
        "runs",
        ["request_key"],
        unique=True,
        postgresql_where=sa.text("request_key IS NOT NULL"),
    )
    op.create_table(
        "call_marks",
        sa.Column("run_id", sa.UUID(as_uuid=False), nullable=False),
        sa.Column("step", sa.Integer(), nullable=False),
        sa.Column("call_index", sa.Integer(), nullable=False),
        sa.Column("call_id", sa.Text(), nullable=False),
        sa.Column("tool", sa.Text(), nullable=False),
        sa.Column("kind", sa.Text(), nullable=False),
        sa.Column("idem_key", sa.Text(), nullable=False),
        sa.Column("stable_key", sa.Boolean(), nullable=False),
        sa.Column("status", sa.Text(), server_default="in_doubt", nullable=False),
        sa.Column("outcome", sa.LargeBinary(), nullable=True),
        sa.Column("settlement", sa.Text(), nullable=True),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column(
            "marked_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False
        ),
        sa.Column("settled_at", sa.DateTime(timezone=True), nullable=True),
        sa.CheckConstraint(
            "status IN ('in_doubt','done','settled')", name=op.f("ck_call_marks_status")
        ),
        sa.ForeignKeyConstraint(
            ["run_id"], ["runs.id"], name=op.f("fk_call_marks_run_id_runs"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("run_id", "step", "call_index", name=op.f("pk_call_marks")),
    )
    op.create_table(
        "checkpoints",
        sa.Column("run_id", sa.UUID(as_uuid=False), nullable=False),
        sa.Column("step", sa.Integer(), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("sealed", sa.LargeBinary(), nullable=False),
        sa.Column(
            "created_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.ForeignKeyConstraint(
            ["run_id"], ["runs.id"], name=op.f("fk_checkpoints_run_id_runs"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("run_id", "step", name=op.f("pk_checkpoints")),
    )
    op.create_table(
        "transcript_messages",
        sa.Column("id", sa.BigInteger(), sa.Identity(always=False), nullable=False),
        sa.Column("run_id", sa.UUID(as_uuid=False), nullable=False),
        sa.Column("role", sa.Text(), nullable=False),
        sa.Column("content", sa.Text(), nullable=False),
        sa.Column(
            "created_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.ForeignKeyConstraint(
            ["run_id"],
            ["runs.id"],
            name=op.f("fk_transcript_messages_run_id_runs"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_transcript_messages")),
    )
    op.create_index(
        "ix_transcript_messages_run_id", "transcript_messages", ["run_id"], unique=False
    )


def downgrade() -> None:
    op.drop_index("ix_transcript_messages_run_id", table_name="transcript_messages")
    op.drop_table("transcript_messages")
    op.drop_table("checkpoints")
    op.drop_table("call_marks")
    op.drop_index(
        "uq_runs_request_key",
        table_name="runs",
        postgresql_where=sa.text("request_key IS NOT NULL"),
    )
    op.drop_index(
        "ix_runs_queued_at", table_name="runs", postgresql_where=sa.text("status = 'queued'")
    )
    op.drop_index(
        "ix_runs_live",
        table_name="runs",
        postgresql_where=sa.text("status IN ('running','answered')"),
    )
    op.drop_table("runs")
    op.drop_index("ix_model_requests_run_id", table_name="model_requests")
    op.drop_table("model_requests")
    op.drop_index("ix_audit_events_run_id", table_name="audit_events")
    op.drop_index("ix_audit_events_kind", table_name="audit_events")
    op.drop_table("audit_events")
