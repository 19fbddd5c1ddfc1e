"""edges: A2A tasks as the A2A 1.0 protocol keeps them, Teams turns as Bot Framework activities

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-02 10:00:00
"""

from alembic import op
import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import JSONB


revision = '0006'
down_revision = '0005'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column('a2a_tasks', sa.Column('context_id', sa.Text(), nullable=True))
    op.add_column('a2a_tasks', sa.Column('message', JSONB(), nullable=True))
    op.add_column(
        'a2a_tasks', sa.Column('canceled_at', sa.DateTime(timezone=True), nullable=True)
    )
    op.create_index('ix_a2a_tasks_context_id', 'a2a_tasks', ['context_id'])
    op.create_index('ix_a2a_tasks_created_at', 'a2a_tasks', ['created_at', 'id'])
    op.add_column('teams_inbox', sa.Column('service_url', sa.Text(), nullable=True))
    op.add_column('teams_inbox', sa.Column('activity', JSONB(), nullable=True))
    # Activity ids are unique within a conversation, not across conversations.
    op.drop_index('uq_teams_inbox_message_id', table_name='teams_inbox')
    op.create_index(
        'uq_teams_inbox_activity', 'teams_inbox', ['conversation', 'message_id'], unique=True
    )
    op.create_index('ix_teams_inbox_run_id', 'teams_inbox', ['run_id'])


def downgrade() -> None:
    op.drop_index('ix_teams_inbox_run_id', table_name='teams_inbox')
    op.drop_index('uq_teams_inbox_activity', table_name='teams_inbox')
    op.create_index('uq_teams_inbox_message_id', 'teams_inbox', ['message_id'], unique=True)
    op.drop_column('teams_inbox', 'activity')
    op.drop_column('teams_inbox', 'service_url')
    op.drop_index('ix_a2a_tasks_created_at', table_name='a2a_tasks')
    op.drop_index('ix_a2a_tasks_context_id', table_name='a2a_tasks')
    op.drop_column('a2a_tasks', 'canceled_at')
    op.drop_column('a2a_tasks', 'message')
    op.drop_column('a2a_tasks', 'context_id')
