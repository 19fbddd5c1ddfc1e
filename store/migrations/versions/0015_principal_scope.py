"""principal scope: a run records the front principal that started it, and request keys and
A2A task ids are unique per principal, so another caller's key is another run (never theirs)
and the front shows each principal only its own runs and tasks

Revision ID: 0015_principal_scope
Revises: 0014_teams_owner_ids
Create Date: 2026-12-06 07:10:00
"""

from alembic import op
import sqlalchemy as sa


revision = "0015_principal_scope"
down_revision = "0014_teams_owner_ids"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Nullable, no rewrite: a run stored before keeps NULL, which only an operator's read sees.
    op.add_column("runs", sa.Column("principal", sa.Text(), nullable=True))
    op.create_index(
        "uq_runs_request_key_principal",
        "runs",
        ["request_key", "principal"],
        unique=True,
        postgresql_nulls_not_distinct=True,
        postgresql_where=sa.text("request_key IS NOT NULL"),
    )
    op.drop_index("uq_runs_request_key", table_name="runs")
    op.add_column("a2a_tasks", sa.Column("principal", sa.Text(), nullable=True))
    op.drop_constraint("pk_a2a_tasks", "a2a_tasks", type_="primary")
    op.create_primary_key("pk_a2a_tasks", "a2a_tasks", ["run_id"])
    op.drop_index("uq_a2a_tasks_run_id", table_name="a2a_tasks")
    op.create_index(
        "uq_a2a_tasks_id_principal",
        "a2a_tasks",
        ["id", "principal"],
        unique=True,
        postgresql_nulls_not_distinct=True,
    )
    op.create_index(
        "ix_a2a_tasks_principal_created_at", "a2a_tasks", ["principal", "created_at", "id"]
    )


def _refuse_if_shared(sql: str, what: str) -> None:
    """Going back makes keys global again: refused while two principals share one."""
    shared = op.get_bind().execute(sa.text(sql)).scalar_one()
    if shared:
        raise RuntimeError(
            f"cannot downgrade below 0015_principal_scope: {shared} {what} used by more than "
            "one principal; erase or delete those runs first"
        )


def downgrade() -> None:
    _refuse_if_shared(
        "SELECT count(*) FROM (SELECT request_key FROM runs WHERE request_key IS NOT NULL "
        "GROUP BY request_key HAVING count(*) > 1) d",
        "request key(s) are",
    )
    _refuse_if_shared(
        "SELECT count(*) FROM (SELECT id FROM a2a_tasks GROUP BY id HAVING count(*) > 1) d",
        "A2A task id(s) are",
    )
    op.drop_index("ix_a2a_tasks_principal_created_at", table_name="a2a_tasks")
    op.drop_index("uq_a2a_tasks_id_principal", table_name="a2a_tasks")
    op.create_index("uq_a2a_tasks_run_id", "a2a_tasks", ["run_id"], unique=True)
    op.drop_constraint("pk_a2a_tasks", "a2a_tasks", type_="primary")
    op.create_primary_key("pk_a2a_tasks", "a2a_tasks", ["id"])
    op.drop_column("a2a_tasks", "principal")
    op.create_index(
        "uq_runs_request_key",
        "runs",
        ["request_key"],
        unique=True,
        postgresql_where=sa.text("request_key IS NOT NULL"),
    )
    op.drop_index("uq_runs_request_key_principal", table_name="runs")
    op.drop_column("runs", "principal")
