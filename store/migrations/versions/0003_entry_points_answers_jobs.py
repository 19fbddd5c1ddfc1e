"""entry points answers jobs

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-30 04:01:10.210231
"""

from alembic import op
import sqlalchemy as sa
from sqlalchemy.dialects import postgresql

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Jobs are a third kind of run (autogenerate does not compare check constraints).
    op.drop_constraint(op.f("ck_runs_kind"), "runs", type_="check")
    op.create_check_constraint(op.f("ck_runs_kind"), "runs", "kind IN ('agent','workflow','job')")
    op.create_table(
        "documents",
        sa.Column("source", sa.Text(), nullable=False),
        sa.Column("doc_id", sa.Text(), nullable=False),
        sa.Column("title", sa.Text(), nullable=False),
        sa.Column("content", sa.Text(), nullable=False),
        sa.Column("content_hash", sa.Text(), nullable=False),
        sa.Column("version", sa.Integer(), server_default="1", nullable=False),
        sa.Column("synced_by", sa.UUID(as_uuid=False), nullable=True),
        sa.Column(
            "updated_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.PrimaryKeyConstraint("source", "doc_id", name=op.f("pk_documents")),
    )
    op.create_table(
        "teams_inbox",
        sa.Column("id", sa.BigInteger(), sa.Identity(always=False), nullable=False),
        sa.Column("message_id", sa.Text(), nullable=False),
        sa.Column("conversation", sa.Text(), nullable=False),
        sa.Column("sender", sa.Text(), nullable=False),
        sa.Column("agent", sa.Text(), nullable=False),
        sa.Column("text", sa.Text(), nullable=False),
        sa.Column("status", sa.Text(), server_default="new", nullable=False),
        sa.Column("run_id", sa.UUID(as_uuid=False), nullable=True),
        sa.Column("reply", postgresql.JSONB(astext_type=sa.Text()), nullable=True),
        sa.Column(
            "created_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.Column("replied_at", sa.DateTime(timezone=True), nullable=True),
        sa.CheckConstraint(
            "status IN ('new','running','replied','failed')", name=op.f("ck_teams_inbox_status")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_teams_inbox")),
    )
    op.create_index(
        "ix_teams_inbox_new",
        "teams_inbox",
        ["id"],
        unique=False,
        postgresql_where=sa.text("status = 'new'"),
    )
    op.create_index("uq_teams_inbox_message_id", "teams_inbox", ["message_id"], unique=True)
    op.create_table(
        "a2a_tasks",
        sa.Column("id", sa.Text(), nullable=False),
        sa.Column("run_id", sa.UUID(as_uuid=False), nullable=False),
        sa.Column("status", sa.Text(), server_default="submitted", nullable=False),
        sa.Column("answer", sa.Text(), nullable=True),
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
        sa.ForeignKeyConstraint(
            ["run_id"], ["runs.id"], name=op.f("fk_a2a_tasks_run_id_runs"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_a2a_tasks")),
    )
    op.create_index("uq_a2a_tasks_run_id", "a2a_tasks", ["run_id"], unique=True)
    op.create_table(
        "cron_runs",
        sa.Column("trigger", sa.Text(), nullable=False),
        sa.Column("scheduled_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("run_id", sa.UUID(as_uuid=False), nullable=False),
        sa.Column("status", sa.Text(), server_default="running", nullable=False),
        sa.Column("outcome", sa.Text(), nullable=True),
        sa.Column(
            "created_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.Column("recorded_at", sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(
            ["run_id"], ["runs.id"], name=op.f("fk_cron_runs_run_id_runs"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("trigger", "scheduled_at", name=op.f("pk_cron_runs")),
    )
    op.create_index("uq_cron_runs_run_id", "cron_runs", ["run_id"], unique=True)
    op.add_column(
        "runs", sa.Column("resumable", sa.Boolean(), server_default=sa.text("true"), nullable=False)
    )
    op.add_column("runs", sa.Column("answer_expires_at", sa.DateTime(timezone=True), nullable=True))
    op.add_column("runs", sa.Column("answer_purged_at", sa.DateTime(timezone=True), nullable=True))
    op.create_index(
        "ix_runs_answer_expires_at",
        "runs",
        ["answer_expires_at"],
        unique=False,
        postgresql_where=sa.text("answer IS NOT NULL AND status = 'succeeded'"),
    )


def downgrade() -> None:
    op.drop_constraint(op.f("ck_runs_kind"), "runs", type_="check")
    op.create_check_constraint(op.f("ck_runs_kind"), "runs", "kind IN ('agent','workflow')")
    op.drop_index(
        "ix_runs_answer_expires_at",
        table_name="runs",
        postgresql_where=sa.text("answer IS NOT NULL AND status = 'succeeded'"),
    )
    op.drop_column("runs", "answer_purged_at")
    op.drop_column("runs", "answer_expires_at")
    op.drop_column("runs", "resumable")
    op.drop_index("uq_cron_runs_run_id", table_name="cron_runs")
    op.drop_table("cron_runs")
    op.drop_index("uq_a2a_tasks_run_id", table_name="a2a_tasks")
    op.drop_table("a2a_tasks")
    op.drop_index("uq_teams_inbox_message_id", table_name="teams_inbox")
    op.drop_index(
        "ix_teams_inbox_new", table_name="teams_inbox", postgresql_where=sa.text("status = 'new'")
    )
    op.drop_table("teams_inbox")
    op.drop_table("documents")
