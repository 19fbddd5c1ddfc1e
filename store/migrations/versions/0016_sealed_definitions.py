"""sealed definitions: a run's definition (model, tools, system prompt, entry details, workflow
or job, who it is) is sealed with its run id in `runs.definition`, replacing the plain `spec`
JSON a database writer could edit (issue 30). Unfinished runs have theirs sealed here, by the
callable `liyagent db upgrade` hands over with the deployment's seal keys; finished runs keep
none (nothing reads it again). After `0014_teams_owner_ids`, so a Teams run's definition is
sealed with the owner that revision gave it.

Revision ID: 0016_sealed_definitions
Revises: 0015_principal_scope
Create Date: 2026-12-06 08:00:00
"""

import json

import sqlalchemy as sa
from alembic import context, op

revision = "0016_sealed_definitions"
down_revision = "0015_principal_scope"
branch_labels = None
depends_on = None

UNFINISHED = """
SELECT id, spec, agent, owner, entry_kind, kind, channel, run_as,
       CAST(parent_run_id AS text) AS parent_run_id, correlation_id, resumable, principal,
       checkpoint
FROM runs WHERE status NOT IN ('succeeded', 'failed')
"""


def upgrade() -> None:
    op.add_column("runs", sa.Column("definition", sa.LargeBinary(), nullable=True))
    conn = op.get_bind()
    rows = conn.execute(sa.text(UNFINISHED)).mappings().all()
    seal = context.config.attributes.get("seal_definition")
    if rows and seal is None:
        raise RuntimeError(
            f"{len(rows)} unfinished runs need their definitions sealed: stop every worker, beat "
            "and front, then run `liyagent db upgrade` with the deployment's LIYAGENT_SEAL_KEYS"
        )
    for row in rows:
        conn.execute(
            sa.text("UPDATE runs SET definition = :d WHERE id = :id"),
            {"d": seal(dict(row)), "id": row["id"]},
        )
    op.drop_column("runs", "spec")


def downgrade() -> None:
    # The code before this revision reads a plain spec, which cannot be rebuilt without the
    # seal keys: refused while a run could still be taken up.
    conn = op.get_bind()
    left = conn.execute(
        sa.text("SELECT count(*) FROM runs WHERE status NOT IN ('succeeded', 'failed')")
    ).scalar()
    if left:
        raise RuntimeError(
            f"{left} unfinished runs have sealed definitions the older code cannot read; let "
            "them finish first"
        )
    op.add_column(
        "runs",
        sa.Column(
            "spec",
            sa.dialects.postgresql.JSONB(),
            nullable=False,
            server_default=sa.text(f"'{json.dumps({})}'::jsonb"),
        ),
    )
    op.alter_column("runs", "spec", server_default=None)
    op.drop_column("runs", "definition")
