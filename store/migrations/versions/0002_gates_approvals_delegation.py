"""gates approvals delegation

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-30 03:48:21.086411
"""

from alembic import op
import sqlalchemy as sa
from sqlalchemy.dialects import postgresql

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "agent_tools",
        sa.Column("agent", sa.Text(), nullable=False),
        sa.Column("tool", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("agent", "tool", name=op.f("pk_agent_tools")),
    )
    op.create_table(
        "channels",
        sa.Column("name", sa.Text(), nullable=False),
        sa.Column("enabled", sa.Boolean(), server_default=sa.text("true"), nullable=False),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.Column(
            "updated_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.PrimaryKeyConstraint("name", name=op.f("pk_channels")),
    )
    op.create_table(
        "principals",
        sa.Column("name", sa.Text(), nullable=False),
        sa.Column("may_run", sa.Boolean(), server_default=sa.text("true"), nullable=False),
        sa.Column("may_act", sa.Boolean(), server_default=sa.text("true"), nullable=False),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.Column(
            "updated_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.PrimaryKeyConstraint("name", name=op.f("pk_principals")),
    )
    op.create_table(
        "stops",
        sa.Column("id", sa.BigInteger(), sa.Identity(always=False), nullable=False),
        sa.Column("run_id", sa.UUID(as_uuid=False), nullable=True),
        sa.Column("agent", sa.Text(), nullable=True),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("created_by", sa.Text(), nullable=False),
        sa.Column(
            "created_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.Column("lifted_at", sa.DateTime(timezone=True), nullable=True),
        sa.CheckConstraint("(run_id IS NULL) <> (agent IS NULL)", name=op.f("ck_stops_one_target")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_stops")),
    )
    op.create_index(
        "ix_stops_agent",
        "stops",
        ["agent"],
        unique=False,
        postgresql_where=sa.text("lifted_at IS NULL"),
    )
    op.create_index(
        "ix_stops_run_id",
        "stops",
        ["run_id"],
        unique=False,
        postgresql_where=sa.text("lifted_at IS NULL"),
    )
    op.create_table(
        "approvals",
        sa.Column("id", sa.UUID(as_uuid=False), nullable=False),
        sa.Column("run_id", sa.UUID(as_uuid=False), nullable=False),
        sa.Column("step", sa.Integer(), nullable=False),
        sa.Column("call_index", sa.Integer(), nullable=False),
        sa.Column("step_key", sa.Text(), nullable=False),
        sa.Column("tool", sa.Text(), nullable=False),
        sa.Column("args", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.Column("status", sa.Text(), server_default="pending", nullable=False),
        sa.Column("decided_by", sa.Text(), nullable=True),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.Column(
            "created_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.Column("decided_at", sa.DateTime(timezone=True), nullable=True),
        sa.CheckConstraint(
            "status IN ('pending','approved','denied')", name=op.f("ck_approvals_status")
        ),
        sa.ForeignKeyConstraint(
            ["run_id"], ["runs.id"], name=op.f("fk_approvals_run_id_runs"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_approvals")),
    )
    op.create_index("ix_approvals_run_id", "approvals", ["run_id"], unique=False)
    op.create_index("uq_approvals_step_key", "approvals", ["step_key"], unique=True)
    op.add_column("runs", sa.Column("kind", sa.Text(), server_default="agent", nullable=False))
    op.create_check_constraint(op.f("ck_runs_kind"), "runs", "kind IN ('agent','workflow')")
    op.add_column("runs", sa.Column("channel", sa.Text(), server_default="api", nullable=False))
    op.add_column("runs", sa.Column("run_as", sa.Text(), nullable=True))
    op.add_column("runs", sa.Column("parent_run_id", sa.UUID(as_uuid=False), nullable=True))
    op.add_column("runs", sa.Column("waiting_on", sa.Text(), nullable=True))
    op.create_index(
        "ix_runs_parent_run_id",
        "runs",
        ["parent_run_id"],
        unique=False,
        postgresql_where=sa.text("parent_run_id IS NOT NULL"),
    )
    op.create_index(
        "ix_runs_waiting",
        "runs",
        ["id"],
        unique=False,
        postgresql_where=sa.text("status = 'waiting'"),
    )


def downgrade() -> None:
    op.drop_index(
        "ix_runs_waiting", table_name="runs", postgresql_where=sa.text("status = 'waiting'")
    )
    op.drop_index(
        "ix_runs_parent_run_id",
        table_name="runs",
        postgresql_where=sa.text("parent_run_id IS NOT NULL"),
    )
    op.drop_column("runs", "waiting_on")
    op.drop_column("runs", "parent_run_id")
    op.drop_column("runs", "run_as")
    op.drop_column("runs", "channel")
    op.drop_constraint(op.f("ck_runs_kind"), "runs", type_="check")
    op.drop_column("runs", "kind")
    op.drop_index("uq_approvals_step_key", table_name="approvals")
    op.drop_index("ix_approvals_run_id", table_name="approvals")
    op.drop_table("approvals")
    op.drop_index(
        "ix_stops_run_id", table_name="stops", postgresql_where=sa.text("lifted_at IS NULL")
    )
    op.drop_index(
        "ix_stops_agent", table_name="stops", postgresql_where=sa.text("lifted_at IS NULL")
    )
    op.drop_table("stops")
    op.drop_table("principals")
    op.drop_table("channels")
    op.drop_table("agent_tools")
