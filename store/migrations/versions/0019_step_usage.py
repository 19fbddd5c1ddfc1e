"""step usage: the tokens each model step's response reported (input, of it cached, output) and
the model it names, on the row the step is written in, set by the statement that writes it
(issue 34): a step record's columns, and the run's for the step that gave its final answer.
Nullable, no rewrite: a step written before has no usage recorded.

Revision ID: 0019_step_usage
Revises: 0018_tenants
Create Date: 2026-12-06 18:00:00
"""

import sqlalchemy as sa
from alembic import op

revision = "0019_step_usage"
down_revision = "0018_tenants"
branch_labels = None
depends_on = None

_TABLES = (("run_steps", ""), ("runs", "answer_"))
_COUNTS = ("input_tokens", "output_tokens", "cached_tokens")


def upgrade() -> None:
    for table, prefix in _TABLES:
        for name in _COUNTS:
            op.add_column(table, sa.Column(f"{prefix}{name}", sa.Integer, nullable=True))
        op.add_column(table, sa.Column(f"{prefix}model", sa.Text, nullable=True))


def downgrade() -> None:
    for table, prefix in _TABLES:
        for name in (*_COUNTS, "model"):
            op.drop_column(table, f"{prefix}{name}")
