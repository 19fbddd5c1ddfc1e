"""The entry kinds' tables: where a run came from (an A2A task, a cron fire, a Teams turn)
and where its answer is handed on."""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import JSONB, UUID

from store.schema.base import metadata, now

a2a_tasks = sa.Table(
    "a2a_tasks",
    metadata,
    # An A2A task another agent created here; its run's answer lands on it. A new task is named
    # after the message that created it (its messageId), so a repeated message is the same task;
    # ids are unique per principal (the run's), so another caller's message id is another task.
    sa.Column("id", sa.Text, nullable=False),
    sa.Column(
        "run_id",
        UUID(as_uuid=False),
        sa.ForeignKey("runs.id", ondelete="CASCADE"),
        primary_key=True,
    ),
    sa.Column("principal", sa.Text, nullable=True),
    # submitted, completed or failed, as the run's end left it; GetTask reads the live state
    # from the run (working, input-required, auth-required) and from canceled_at.
    sa.Column("status", sa.Text, nullable=False, server_default="submitted"),
    sa.Column("answer", sa.Text, nullable=True),
    # The A2A contextId (the client's, or one made here) and the message as received.
    sa.Column("context_id", sa.Text, nullable=True),
    sa.Column("message", JSONB, nullable=True),
    # Set by CancelTask (an operator Stop of the run): a run that then fails was canceled.
    sa.Column("canceled_at", sa.DateTime(timezone=True), nullable=True),
    sa.Column("created_at", sa.DateTime(timezone=True), nullable=False, server_default=now()),
    sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False, server_default=now()),
    sa.Index(
        "uq_a2a_tasks_id_principal",
        "id",
        "principal",
        unique=True,
        postgresql_nulls_not_distinct=True,
    ),
    sa.Index("ix_a2a_tasks_context_id", "context_id"),
    sa.Index("ix_a2a_tasks_created_at", "created_at", "id"),
    # A principal's ListTasks, newest first.
    sa.Index("ix_a2a_tasks_principal_created_at", "principal", "created_at", "id"),
)

cron_runs = sa.Table(
    "cron_runs",
    metadata,
    # One run per trigger and scheduled time, however many beats fire it.
    sa.Column("trigger", sa.Text, nullable=False),
    sa.Column("scheduled_at", sa.DateTime(timezone=True), nullable=False),
    sa.Column(
        "run_id", UUID(as_uuid=False), sa.ForeignKey("runs.id", ondelete="CASCADE"), nullable=False
    ),
    # succeeded or failed, with the outcome, recorded once when the run ends.
    sa.Column("status", sa.Text, nullable=False, server_default="running"),
    sa.Column("outcome", sa.Text, nullable=True),
    sa.Column("created_at", sa.DateTime(timezone=True), nullable=False, server_default=now()),
    sa.Column("recorded_at", sa.DateTime(timezone=True), nullable=True),
    sa.PrimaryKeyConstraint("trigger", "scheduled_at"),
    sa.Index("uq_cron_runs_run_id", "run_id", unique=True),
)

teams_inbox = sa.Table(
    "teams_inbox",
    metadata,
    # The durable inbox of Teams turns (Bot Framework activities); each becomes one turn (one
    # run), replied to once.
    sa.Column("id", sa.BigInteger, sa.Identity(), primary_key=True),
    # The activity's id, unique within its conversation (a repeated delivery is one row).
    sa.Column("message_id", sa.Text, nullable=False),
    # The conversation's id, where the reply goes.
    sa.Column("conversation", sa.Text, nullable=False),
    # Who sent it: their Microsoft Entra object id (the activity's from.aadObjectId, lower
    # case), the owner of its run; never a display name, which is content kept only in the
    # activity. NULL only on a turn stored before 0014 whose activity named none.
    sa.Column("sender_id", sa.Text, nullable=True),
    sa.Column("agent", sa.Text, nullable=False),
    sa.Column("text", sa.Text, nullable=False),
    # The activity's serviceUrl (the Bot Connector the reply is posted to) and the activity
    # itself, as received.
    sa.Column("service_url", sa.Text, nullable=True),
    sa.Column("activity", JSONB, nullable=True),
    # new (waiting for intake), running (its turn is a run), replied or failed.
    sa.Column("status", sa.Text, nullable=False, server_default="new"),
    sa.Column("run_id", UUID(as_uuid=False), nullable=True),
    sa.Column("reply", JSONB, nullable=True),
    sa.Column("created_at", sa.DateTime(timezone=True), nullable=False, server_default=now()),
    sa.Column("replied_at", sa.DateTime(timezone=True), nullable=True),
    sa.CheckConstraint("status IN ('new','running','replied','failed')", name="status"),
    # A turn waiting for intake has an owner to start its run as.
    sa.CheckConstraint("status <> 'new' OR sender_id IS NOT NULL", name="sender"),
    sa.Index("uq_teams_inbox_activity", "conversation", "message_id", unique=True),
    sa.Index("ix_teams_inbox_new", "id", postgresql_where=sa.text("status = 'new'")),
    sa.Index("ix_teams_inbox_run_id", "run_id"),
)
