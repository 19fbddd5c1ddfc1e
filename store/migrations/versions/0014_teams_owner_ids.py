"""teams owner ids: a Teams turn's run is owned by its sender's Microsoft Entra object id
(`from.aadObjectId`), never their display name, which two people may share and anyone can
change; the inbox keeps that id (`sender_id`) instead of the name

Existing rows are carried over from the activity each stored: its aadObjectId becomes the
row's `sender_id`, and the Teams runs (with their sub-agent runs) it started are owned by it
from now on, so an erasure or a revocation by that id covers them too. A revocation recorded
under a display name that owned such runs is copied to the ids of the people whose runs those
were, so nothing it refused gets through after the upgrade (lift a namesake's copy by id). A
turn waiting for intake whose activity named no aadObjectId is marked failed, never started
under a name. A run whose activity was already erased keeps the owner it had.

Revision ID: 0014_teams_owner_ids
Revises: 0013_event_marks
Create Date: 2026-12-06 09:00:00
"""

from alembic import op
import sqlalchemy as sa


revision = "0014_teams_owner_ids"
down_revision = "0013_event_marks"
branch_labels = None
depends_on = None

# Each Teams run with the id its turn's activity names, and every sub-agent run below it that
# has the same owner: (id, old owner, new owner).
_TEAMS_TREE = """
    WITH RECURSIVE tree AS (
        SELECT r.id, r.owner AS was, i.sender_id AS now FROM runs r
        JOIN teams_inbox i ON i.run_id = r.id
        WHERE r.entry_kind = 'teams' AND i.sender_id IS NOT NULL
        UNION ALL
        SELECT c.id, c.owner, t.now FROM runs c JOIN tree t ON c.parent_run_id = t.id
        WHERE c.owner = t.was)
"""


def upgrade() -> None:
    op.add_column("teams_inbox", sa.Column("sender_id", sa.Text(), nullable=True))
    op.execute(
        """
        UPDATE teams_inbox SET sender_id = lower(activity #>> '{from,aadObjectId}')
        WHERE lower(activity #>> '{from,aadObjectId}')
              ~ '^[0-9a-f]{8}-([0-9a-f]{4}-){3}[0-9a-f]{12}$'
        """
    )
    op.execute("UPDATE teams_inbox SET status = 'failed' WHERE status = 'new' AND sender_id IS NULL")
    # Fail closed: what a name's revocation refused stays refused under each person's id.
    op.execute(
        _TEAMS_TREE
        + """
        INSERT INTO principals (name, may_run, may_act, reason)
        SELECT t.now, bool_and(p.may_run), bool_and(p.may_act), min(p.reason)
        FROM tree t JOIN principals p ON p.name = t.was
        WHERE NOT (p.may_run AND p.may_act)
        GROUP BY t.now
        ON CONFLICT (name) DO NOTHING
        """
    )
    op.execute(_TEAMS_TREE + "UPDATE runs SET owner = tree.now FROM tree WHERE runs.id = tree.id")
    op.drop_column("teams_inbox", "sender")
    op.create_check_constraint(
        op.f("ck_teams_inbox_sender"), "teams_inbox", "status <> 'new' OR sender_id IS NOT NULL"
    )


def downgrade() -> None:
    # The older code shows the display name as the sender; runs keep their owner ids (putting
    # names back would make namesakes one owner again).
    op.drop_constraint(op.f("ck_teams_inbox_sender"), "teams_inbox", type_="check")
    op.add_column("teams_inbox", sa.Column("sender", sa.Text(), nullable=True))
    op.execute(
        "UPDATE teams_inbox SET sender = coalesce(activity #>> '{from,name}', sender_id, '')"
    )
    op.alter_column("teams_inbox", "sender", nullable=False)
    op.drop_column("teams_inbox", "sender_id")
