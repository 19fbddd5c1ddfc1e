"""step records: each model step seals only what it added, chained to the record before it, in
`run_steps`; the run's `checkpoint` column keeps its base (the whole state at enqueue, or the
latest whole-state checkpoint of a run in flight during the upgrade, from which its records
continue)

Revision ID: step_records
Revises: 0009
Create Date: 2026-12-01 21:30:00
"""

from alembic import op
import sqlalchemy as sa


revision = "step_records"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Nothing to convert: a run in flight keeps its whole-state checkpoint in runs.checkpoint
    # and, having no step records, resumes from it; its next steps add records after it.
    op.create_table(
        "run_steps",
        sa.Column("run_id", sa.UUID(as_uuid=False), nullable=False),
        sa.Column("step", sa.Integer(), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("sealed", sa.LargeBinary(), nullable=False),
        sa.Column(
            "created_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False
        ),
        sa.CheckConstraint("step >= 1", name=op.f("ck_run_steps_step_positive")),
        sa.ForeignKeyConstraint(
            ["run_id"], ["runs.id"], name=op.f("fk_run_steps_run_id_runs"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("run_id", "step", name=op.f("pk_run_steps")),
    )


def downgrade() -> None:
    # The older code reads only a whole-state checkpoint: a run still going with step records
    # could not continue under it. Refuse rather than fail such runs.
    live = (
        op.get_bind()
        .execute(
            sa.text(
                "SELECT count(DISTINCT s.run_id) FROM run_steps s JOIN runs r ON r.id = s.run_id "
                "WHERE r.status IN ('queued', 'running', 'waiting')"
            )
        )
        .scalar_one()
    )
    if live:
        raise RuntimeError(
            f"{live} unfinished runs have step records the older code cannot read; let them "
            "finish (or fail them) before downgrading"
        )
    op.drop_table("run_steps")
