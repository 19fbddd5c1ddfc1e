"""lean steps: the latest sealed checkpoint lives on the run's row (one row write a step), the
run keeps its own input, and model requests are judged from the model server's records

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-30 22:30:00
"""

from alembic import op
import sqlalchemy as sa


revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("runs", sa.Column("input", sa.Text(), server_default="", nullable=False))
    op.add_column("runs", sa.Column("checkpoint", sa.LargeBinary(), nullable=True))
    op.add_column("runs", sa.Column("checkpoint_attempt", sa.Integer(), nullable=True))
    op.add_column(
        "runs", sa.Column("checkpointed_at", sa.DateTime(timezone=True), nullable=True)
    )
    # Each run keeps its latest checkpoint and the attempt that wrote it.
    op.execute(
        """
        UPDATE runs SET checkpoint = c.sealed, checkpoint_attempt = c.attempt,
               checkpointed_at = c.created_at
        FROM (SELECT DISTINCT ON (run_id) run_id, sealed, attempt, created_at
              FROM checkpoints ORDER BY run_id, step DESC) c
        WHERE runs.id = c.run_id
        """
    )
    # The first user line of a transcript becomes the run's input.
    op.execute(
        """
        WITH first AS (
            SELECT DISTINCT ON (run_id) id, run_id, content FROM transcript_messages
            WHERE role = 'user' ORDER BY run_id, id)
        UPDATE runs SET input = first.content FROM first WHERE runs.id = first.run_id
        """
    )
    op.execute(
        """
        DELETE FROM transcript_messages t USING (
            SELECT DISTINCT ON (run_id) id FROM transcript_messages
            WHERE role = 'user' ORDER BY run_id, id) first
        WHERE t.id = first.id
        """
    )
    op.drop_table("checkpoints")
    op.drop_index("ix_model_requests_run_id", table_name="model_requests")
    op.drop_table("model_requests")


def downgrade() -> None:
    op.create_table(
        "model_requests",
        sa.Column("id", sa.BigInteger(), sa.Identity(always=False), nullable=False),
        sa.Column("run_id", sa.UUID(as_uuid=False), nullable=False),
        sa.Column("step", sa.Integer(), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("provider", sa.Text(), nullable=False),
        sa.Column(
            "tool_results",
            sa.dialects.postgresql.JSONB(astext_type=sa.Text()),
            server_default=sa.text("'[]'::jsonb"),
            nullable=False,
        ),
        sa.Column(
            "created_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_model_requests")),
    )
    op.create_index("ix_model_requests_run_id", "model_requests", ["run_id", "step"])
    op.create_table(
        "checkpoints",
        sa.Column("run_id", sa.UUID(as_uuid=False), nullable=False),
        sa.Column("step", sa.Integer(), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("sealed", sa.LargeBinary(), nullable=False),
        sa.Column(
            "created_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False
        ),
        sa.ForeignKeyConstraint(
            ["run_id"], ["runs.id"], name=op.f("fk_checkpoints_run_id_runs"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("run_id", "step", name=op.f("pk_checkpoints")),
    )
    op.execute(
        "INSERT INTO checkpoints (run_id, step, attempt, sealed, created_at) "
        "SELECT id, step, coalesce(checkpoint_attempt, 1), checkpoint, "
        "coalesce(checkpointed_at, created_at) FROM runs WHERE checkpoint IS NOT NULL"
    )
    op.execute(
        "INSERT INTO transcript_messages (run_id, role, content, created_at) "
        "SELECT id, 'user', input, created_at FROM runs WHERE input <> ''"
    )
    op.drop_column("runs", "checkpointed_at")
    op.drop_column("runs", "checkpoint_attempt")
    op.drop_column("runs", "checkpoint")
    op.drop_column("runs", "input")
